"""What backends share beyond their contract: checks of `options:` and of the runtime's
executable, the CUDA devices of a launch, the target's API key, the pairing guard on the
target's model files, and an OpenAI-compatible completion for `specfleet bench`. Functions,
so that the Backend class holds only what a backend may override (plugin/backend.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp
from pydantic import BaseModel, ValidationError

from supervisor.config.loader import validation_problems
from supervisor.config.schema import METHODS_WITH_DRAFT_FILE, Target
from supervisor.config.sourcemap import MISSING, Problem
from supervisor.errors import SpecfleetError
from supervisor.gpu.vram import Assignment
from supervisor.models import facts, pairing
from supervisor.plugin.values import Generation


class Backend(Protocol):
    """What these helpers use of a backend (plugin/backend.py's Backend)."""

    target: Target
    default_binary: str

    @property
    def base_url(self) -> str: ...

    def resolve_binary(self) -> str: ...

    def model_files(self) -> dict[str, str]: ...

    def auth_headers(self) -> dict[str, str]: ...


def check_options(target: Target, allowed: Mapping[str, tuple[type, ...]]) -> list[Problem]:
    """Problems with `options:`: unknown keys and wrong types (a bool is no int)."""
    problems = []
    for key, value in target.options.items():
        kinds = allowed.get(key)
        if kinds is None:
            problems.append(Problem(("options", key), f"unknown {target.backend} option; "
                                    f"valid: {', '.join(sorted(allowed))}"))
        elif not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            problems.append(Problem(("options", key), f"expected "
                                    f"{' or '.join(k.__name__ for k in kinds)}, got {value!r}"))
    return problems


def check_settings(model: type[BaseModel], values: Mapping[str, Any],
                   where: tuple[str, ...]) -> list[Problem]:
    """`values` (a target's `options:`, say) against a pydantic model of them: each error
    as the fleet file's problem, at `where` + its place (the file's line, the bad value and
    what is valid, as for every key)."""
    try:
        model.model_validate(values)
    except ValidationError as exc:
        return validation_problems(exc, model, where)
    return []


def check_binary_found(backend: Callable[[Target], Backend], target: Target) -> list[Problem]:
    """For runtimes usually checked away from the GPU host that runs them: a runtime
    missing from PATH here is a warning; a `binary:` that does not exist is an error."""
    try:
        backend(target).resolve_binary()
    except SpecfleetError as exc:
        if target.binary:
            return [Problem(("binary",), str(exc), MISSING)]
        return [Problem((), f"{exc} (the target cannot start on this machine)", "warning")]
    return []


def command_binary(backend: Backend) -> str:
    """The executable for a command line: resolved, or its bare name when it is not
    installed here (`check` on another machine than the GPU host; `preflight` refuses)."""
    try:
        return backend.resolve_binary()
    except SpecfleetError:
        return backend.target.binary or backend.default_binary


def cuda_env(target: Target, placement: Assignment | None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for the target: none, the planner's GPUs, or the file's."""
    gpus = target.gpus
    if gpus == "none":
        return {"CUDA_VISIBLE_DEVICES": ""}
    chosen = placement.gpus if placement is not None else gpus
    if isinstance(chosen, tuple):
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, chosen))}
    return {}


def api_key(target: Target) -> str | None:
    """The target's API key read from its source; never log the result."""
    source = target.api_key
    return None if source is None else source.read(f"target '{target.name}': api_key")


def pairing_findings(backend: Backend) -> list[pairing.Finding]:
    """Does the draft (head) fit the target? Reads the model files' headers; blocking."""
    spec = backend.target.speculation
    if spec.method not in METHODS_WITH_DRAFT_FILE:
        return []
    files = backend.model_files()
    if "model" not in files or (spec.draft and "draft" not in files):
        return []  # the backend's check() reports missing files; remote refs cannot be read
    target = facts.read(files["model"])
    if "draft" not in files:
        return pairing.check_mtp(target, None) if spec.method == "mtp" else []
    return pairing.check_pair(target, facts.read(files["draft"]), spec.method, facts.read_tokens)


async def openai_completion(backend: Backend, http: aiohttp.ClientSession, model: str,
                            prompt: str, max_tokens: int,
                            sampling: Mapping[str, object]) -> Generation:
    """One completion through the runtime's /v1/completions, timed by the wall clock."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, **sampling}
    started = time.perf_counter()
    async with http.post(f"{backend.base_url}/v1/completions", json=body,
                         headers=backend.auth_headers()) as resp:
        resp.raise_for_status()
        data = await resp.json()
    seconds = time.perf_counter() - started
    return Generation(data["choices"][0]["text"], int(data["usage"]["completion_tokens"]),
                      seconds)
