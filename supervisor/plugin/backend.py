"""The backend contract: everything that differs between runtimes.

A backend class is instantiated per target. It builds the launch spec, probes
readiness, reads metrics and turns the runtime's own failure output into a clear
message. The supervisor never looks at runtime-specific flags, endpoints or
log lines; it only calls these methods.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import aiohttp

from supervisor.config.schema import Target
from supervisor.config.yamlsource import Problem
from supervisor.errors import SpecfleetError
from supervisor.gpu.vram import Assignment, Estimate
from supervisor.plugin.executor import LOCAL, Executor
from supervisor.plugin.helpers import api_key, openai_completion
from supervisor.plugin.launching import LauncherTraits, traits_for
from supervisor.plugin.values import (
    LENGTHS_BY_LOAD,
    Failure,
    FailureKind,
    Generation,
    LaunchSpec,
    MetricsSample,
    Probe,
    Readiness,
    RuntimeInfo,
)

__all__ = ["LENGTHS_BY_LOAD", "Backend", "Failure", "FailureKind", "Generation", "LaunchSpec",
           "MetricsSample", "Probe", "Readiness", "RuntimeInfo"]


class Backend:
    """Subclass per runtime; register the subclass from a `register_backends` hook."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # The executable looked up on PATH when the target sets no `binary:`.
    default_binary: ClassVar[str] = ""
    # True for runtimes that claim a fraction of the GPU rather than what they need
    # (vLLM): the planner then gives each its share explicitly.
    fills_gpu_memory: ClassVar[bool] = False
    # True for runtimes whose models specfleet can manage on a server it did not start
    # (`launcher: external`).
    supports_external: ClassVar[bool] = False
    # Serves a GGUF file by path, so a target may take it from a ModelKit (`modelkit:`,
    # docs/modelkits.md): the daemon pulls it and sets `model` (and the draft) to the cache.
    takes_modelkits: ClassVar[bool] = False
    # Arguments added last for a server that shares the cores with a serving one and must
    # give way to it (the tuner's calibration): whatever makes the runtime's threads sleep
    # while they wait for work instead of spinning (beside a spinning one on a few cores the
    # serving server serves a small fraction of its tokens: benchmarks/README.md,
    # calibration_beside).
    background_args: ClassVar[tuple[str, ...]] = ()

    def __init__(self, target: Target) -> None:
        self.target = target
        # The address of the machine the runtime runs on, when that is not where the
        # fleet file says (a Ray node): probes, counters and the proxy go there.
        self.node_address: str | None = None
        # Where the runtime's commands run: set by a launcher that runs it elsewhere (an
        # image) before preflight.
        self.executor: Executor = LOCAL

    def runs_on(self, executor: Executor) -> None:
        """Where the runtime's commands run from now on (the launcher's runtime host)."""
        self.executor = executor

    def at_node(self, address: str | None) -> None:
        """The machine the runtime runs on, when the launcher placed it (a Ray node)."""
        self.node_address = address

    @property
    def base_url(self) -> str:
        """Where the runtime answers: the target's address, or its node's."""
        if self.node_address is None or self.target.host not in ("0.0.0.0", "", "*", "::"):
            return self.target.base_url  # a loopback or specific bind is reached as written
        host = self.node_address
        return f"http://[{host}]:{self.target.port}" if ":" in host \
            else f"http://{host}:{self.target.port}"

    # --- static checks (specfleet check, and before every start) ---

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        """Problems with this target that the schema cannot see (paths relative to the target)."""
        return []

    def tunable_length(self) -> str | None:
        """What the draft length means for this target's method, or None if nothing tunes."""
        return None

    def default_length(self) -> int | None:
        """The runtime's own draft length for this method when `length.start` is unset."""
        return None

    def length_ceiling(self) -> int:
        """The largest draft length worth trying when `length.max` is unset."""
        return 32

    def ngram_variants(self) -> tuple[str, ...]:
        """The n-gram variants this runtime can switch between with a tunable length (what
        `speculation.variants: auto` means for it); none: the runtime has no variants."""
        return ()

    def drafter_learns(self) -> bool:
        """Whether the drafter keeps what it learned from earlier requests for as long as
        the server runs (a restart empties it): a server just started drafts worse than
        the same setting will once warm, so the tuner does not judge it at first."""
        return False

    def with_variant(self, variant: str | None) -> Backend:
        """This backend for the same target with another n-gram variant (the tuner's)."""
        if variant == self.target.speculation.variant:
            return self
        # `length.start` is the configured variant's; another starts at its runtime default.
        spec = self.target.speculation
        spec = spec.model_copy(update={"variant": variant, "length": spec.length.model_copy(
            update={"start": None})})
        return type(self)(self.target.model_copy(update={"speculation": spec}))

    def with_target(self, target: Target) -> Backend:
        """This backend for `target`, a variation of its own: the same target on another port
        (the server a planned restart starts beside the running one, supervision/handover.py),
        or with the files of its ModelKit once pulled (supervision/pulling.py). Where the
        runtime runs (`node_address`, `executor`) stays."""
        moved = type(self)(target)
        moved.node_address, moved.executor = self.node_address, self.executor
        return moved

    # --- launching ---

    @property
    def launcher_traits(self) -> LauncherTraits:
        """What the target's launcher is like (whether it starts the server, runs it from an
        image, ...): a backend never compares the launcher's name."""
        return traits_for(self.target.launcher)

    def resolve_binary(self) -> str:
        """The runtime executable: `binary:` from the fleet file, else PATH; in an image, the
        command there (`binary:`, else the backend's command on the image's PATH)."""
        if self.launcher_traits.in_image:
            return self.target.binary or self.default_binary
        if self.target.binary:
            return str(Path(self.target.binary).expanduser())
        found = shutil.which(self.default_binary) if self.default_binary else None
        if found is None:
            raise SpecfleetError(
                f"{self.default_binary} was not found on PATH; set binary: for target "
                f"'{self.target.name}'")
        return found

    async def preflight(self) -> RuntimeInfo:
        """Checks that need the runtime itself (its version, its flags); raise SpecfleetError."""
        if self.target.binary or self.default_binary:
            return RuntimeInfo(self.resolve_binary())
        return RuntimeInfo(self.launch_spec().argv[0])  # a backend whose command is configured

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Assignment | None = None) -> LaunchSpec:
        """The command for this target; `speculation=False` runs it without (tuner baseline/off);
        `placement` is the planner's choice of GPUs (and memory share) when it made one."""
        raise NotImplementedError

    def synthetic_acceptance(self, spec: LaunchSpec, rate: float,
                             draft_length: int) -> LaunchSpec | None:
        """`spec` made to accept each drafted token with probability `rate` whatever the
        text (for the tuner's calibration, tuning/calibration.py), or None where the
        runtime cannot: then the cost of a drafted step is learnt from serving only."""
        return None

    # --- models: pairing guard, memory estimate, run record ---

    def model_files(self) -> dict[str, str]:
        """Local model files and directories of this target by role (model, draft)."""
        out = {}
        for role, ref in (("model", self.target.model), ("draft", self.target.speculation.draft)):
            if ref and Path(ref).expanduser().exists():
                out[role] = str(Path(ref).expanduser())
        return out

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        """What this target needs in (GPU) memory, or None if the backend cannot tell."""
        return None

    def openai_model(self) -> str | None:
        """The `model` the runtime's OpenAI-compatible API expects for this target, or None
        when it serves one model and takes any name (llama-server): the proxy then passes
        the client's body through untouched."""
        return None

    def auth_headers(self) -> dict[str, str]:
        key = api_key(self.target)
        return {"Authorization": f"Bearer {key}"} if key else {}

    # --- monitoring ---

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        """One readiness probe. Connection errors and timeouts propagate to the caller."""
        raise NotImplementedError

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        """Current counters, or None if this runtime exposes none."""
        return None

    def explain_failure(self, output_tail: str, returncode: int | None) -> Failure | None:
        """Recognise the runtime's own failure messages; None if nothing is recognised."""
        return None

    def on_output(self, line: str) -> None:
        """Each line the runtime writes (process launcher), for backends whose runtime reports
        metrics only in its log (Ollama)."""

    async def generate(self, http: aiohttp.ClientSession, prompt: str, max_tokens: int,
                       sampling: Mapping[str, object]) -> Generation:
        """One completion for `specfleet bench`: the OpenAI-compatible /v1/completions, timed
        by the wall clock; backends whose runtime reports its own timings override this."""
        return await openai_completion(self, http, self.target.model, prompt, max_tokens,
                                       sampling)

    def describe_launch(self, spec: LaunchSpec) -> list[str]:
        """Lines `specfleet check` prints under the command: files the launch writes."""
        return [f"file {path}:\n" + "\n".join("    " + ln for ln in text.splitlines())
                for path, text in spec.files.items()]
