"""The one import path for plugin authors, of backends and of launchers (docs/plugins.md).

Everything a backend needs is here: the base class and the values it returns, the
target as the fleet file describes it, the fleet-file problem type, the hook marker,
and the helpers the built-in backends share (model headers, memory estimates,
out-of-memory messages, Prometheus text). Built-in backends import from here only,
never from each other, so a third-party backend can do everything they do. A launcher
needs the `Launcher` and `RunningProcess` base classes, `LauncherTraits` and
`LauncherContext`.
"""

from supervisor.config.schema import Target
from supervisor.config.yamlsource import MISSING, Problem
from supervisor.errors import SpecfleetError
from supervisor.gpu.oom import search as find_out_of_memory
from supervisor.gpu.vram import (
    GPU_RUNTIME_OVERHEAD,
    Assignment,
    ContextSettings,
    Estimate,
    GiB,
    MiB,
    llamacpp_model,
)
from supervisor.models.facts import ModelFacts
from supervisor.models.facts import read as read_model_facts
from supervisor.models.gguf import incomplete as gguf_incomplete
from supervisor.models.identity import FileIdentity, file_identity
from supervisor.plugin.backend import (
    LENGTHS_BY_LOAD,
    Backend,
    Failure,
    FailureKind,
    Generation,
    LaunchSpec,
    MetricsSample,
    Probe,
    Readiness,
    RuntimeInfo,
)
from supervisor.plugin.cache import (
    assemble_example_model,
    assemble_pair,
    cache_root,
    example_model_path,
    file_sha256,
    log_tail,
    pair_paths,
    run_logged,
)
from supervisor.plugin.counters import llamacpp_counters, vllm_counters
from supervisor.plugin.executor import LOCAL, Executor
from supervisor.plugin.helpers import (
    api_key,
    check_binary_found,
    check_options,
    check_settings,
    command_binary,
    cuda_env,
    openai_completion,
    pairing_findings,
)
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.launching import (
    Launcher,
    LauncherContext,
    LauncherTraits,
    RunningProcess,
    traits_for,
)
from supervisor.plugin.promtext import Samples, dense_positions
from supervisor.plugin.promtext import parse as parse_prometheus

__all__ = [
    "GPU_RUNTIME_OVERHEAD",
    "LENGTHS_BY_LOAD",
    "LOCAL",
    "MISSING",
    "Assignment",
    "Backend",
    "ContextSettings",
    "Estimate",
    "Executor",
    "Failure",
    "FailureKind",
    "FileIdentity",
    "Generation",
    "GiB",
    "LaunchSpec",
    "Launcher",
    "LauncherContext",
    "LauncherTraits",
    "MetricsSample",
    "MiB",
    "ModelFacts",
    "Probe",
    "Problem",
    "Readiness",
    "RunningProcess",
    "RuntimeInfo",
    "Samples",
    "SpecfleetError",
    "Target",
    "api_key",
    "assemble_example_model",
    "assemble_pair",
    "cache_root",
    "check_binary_found",
    "check_options",
    "check_settings",
    "command_binary",
    "cuda_env",
    "dense_positions",
    "example_model_path",
    "file_identity",
    "file_sha256",
    "find_out_of_memory",
    "gguf_incomplete",
    "hookimpl",
    "llamacpp_counters",
    "llamacpp_model",
    "log_tail",
    "openai_completion",
    "pair_paths",
    "pairing_findings",
    "parse_prometheus",
    "read_model_facts",
    "run_logged",
    "traits_for",
    "vllm_counters",
]
