"""`backend: command`: any OpenAI-compatible server, started by the command the fleet file
gives (TabbyAPI, koboldcpp, ik_llama.cpp and llama.cpp forks, SGLang, whisper.cpp's and
stable-diffusion.cpp's servers, a LiteLLM proxy in front of something else).

    targets:
      tabby:
        backend: command
        model: /models/qwen-7b               # {model} in the command
        port: 8090
        options:
          command: [/opt/tabby/start.sh, --host, "{host}", --port, "{port}",
                    --model, "{model}"]
          health: {path: /health}            # default: GET /v1/models answering 200
          metrics: {path: /metrics, names: llamacpp}   # default: none
          memory: 6GiB                       # what it holds, for on-demand swapping
          served_model: qwen                 # the name its API answers to
          stop_signal: SIGINT                # default SIGTERM

Every supervision feature applies as for the built-in backends (restarts with backoff, hang
detection, on-demand loading and swapping, the proxy and its holding, every launcher, the
status page, run records): they work on a process, a port and a health check. Where the
server's counters follow llama.cpp's or vLLM's names (`metrics.names`), acceptance and
speed are read as for those backends, and with `{draft_length}` in the command the tuner
tunes it; otherwise speculation is the server's business and status says it has nothing
to tune. The server is stopped as any other (SIGTERM, or `options.stop_signal`, then
`restart.stop_grace`, then SIGKILL), with every process it started.
"""

from __future__ import annotations

import shutil
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, field_validator

from supervisor.plugin import (
    MISSING,
    Backend,
    Estimate,
    LaunchSpec,
    MetricsSample,
    Probe,
    Problem,
    Readiness,
    Target,
    api_key,
    check_settings,
    cuda_env,
    hookimpl,
    llamacpp_counters,
    vllm_counters,
)

PLACEHOLDERS = ("host", "port", "model", "draft", "draft_length", "name")


class Health(BaseModel):
    """How the server says it is ready."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(default="/v1/models", pattern=r"^/")
    status: int = Field(default=200, ge=100, le=599)
    # A 1-token completion on top of `path` (a server whose status page answers before
    # its model is loaded).
    completion: bool = False


class Metrics(BaseModel):
    """Where its Prometheus counters are and whose names they follow."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(default="/metrics", pattern=r"^/")
    names: Literal["llamacpp", "vllm"]


class CommandOptions(BaseModel):
    """A `command` target's `options:`."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1)
    health: Health = Health()
    metrics: Metrics | None = None
    memory: int | None = Field(default=None, ge=0)  # bytes (the fleet file's sizes: 6GiB)
    served_model: str | None = None
    # The environment variable the server reads its API key from (LiteLLM's
    # LITELLM_MASTER_KEY): the target's `api_key` is put there, never on the command line.
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # What asks it to stop, before restart.stop_grace and SIGKILL (some servers finish their
    # work on SIGINT and ignore SIGTERM).
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1",
                         "SIGUSR2"] = "SIGTERM"

    @field_validator("command")
    @classmethod
    def _placeholders(cls, command: list[str]) -> list[str]:
        for arg in command:
            try:
                arg.format(**dict.fromkeys(PLACEHOLDERS, ""))
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"{arg!r}: unknown placeholder {exc}; valid: "
                                 + ", ".join("{" + p + "}" for p in PLACEHOLDERS)) from None
        return command

    @field_validator("memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return _bytes(value) if isinstance(value, str) else value


def _bytes(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
             "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
    number = text.strip().rstrip("BbIiKkMmGgTt ")
    unit = text.strip()[len(number):].strip().upper()
    if unit not in units:
        raise ValueError(f"{text!r} is not a size (e.g. 6GiB, 512MiB)")
    return int(float(number) * units[unit])


class CommandBackend(Backend):
    name = "command"
    description = "any OpenAI-compatible server, started by a command"

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        problems = check_settings(CommandOptions, target.options, ("options",))
        if problems:
            return problems
        options = CommandOptions.model_validate(target.options)
        program = options.command[0]
        if "{" not in program and shutil.which(program) is None:
            # What the host lacks (a tool not installed yet, a mount): the target waits.
            problems.append(Problem(("options", "command", 0), f"{program!r} is not an "
                                    "executable here (not a file, not on PATH)", MISSING))
        if not any("{port}" in arg for arg in options.command):
            problems.append(Problem(("options", "command"), "the command never says {port}: "
                                    "the server would not listen where specfleet probes it",
                                    "warning"))
        tuned = any("{draft_length}" in arg for arg in options.command)
        if target.speculation.method != "none" and not (options.metrics and tuned):
            problems.append(Problem(("speculation", "method"), "the command backend tunes "
                                    "speculation only with {draft_length} in the command and "
                                    "options.metrics naming the server's counters; otherwise "
                                    "set method: none (the server's own speculation is its "
                                    "business)"))
        return problems

    @property
    def options(self) -> CommandOptions:
        return CommandOptions.model_validate(self.target.options)

    def tunable_length(self) -> str | None:
        if self.target.speculation.method == "none":
            return None
        return "{draft_length} in the command"

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Any = None) -> LaunchSpec:
        t = self.target
        length = draft_length if speculation else 0
        values = {"host": t.host, "port": str(t.port), "model": t.model, "name": t.name,
                  "draft": t.speculation.draft or "",
                  "draft_length": str(length if length is not None else "")}
        argv = tuple(arg.format(**values) for arg in self.options.command)
        env = {**dict(t.env), **cuda_env(t, placement)}
        secret: frozenset[str] = frozenset()
        if (name := self.options.key_env) and (key := api_key(t)) is not None:
            env[name], secret = key, frozenset({name})
        return LaunchSpec(argv, env, secret_env=secret, stop_signal=self.options.stop_signal)

    def resolve_binary(self) -> str:
        return self.options.command[0]

    def model_files(self) -> dict[str, str]:
        return {}  # a model is the server's to find (a name, a directory, a file)

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        memory = self.options.memory
        return Estimate(weights=memory) if memory is not None else None

    def openai_model(self) -> str | None:
        return self.options.served_model

    def auth_headers(self) -> dict[str, str]:
        key = api_key(self.target)
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        health = self.options.health
        async with http.get(f"{self.base_url}{health.path}",
                            headers=self.auth_headers()) as resp:
            if resp.status != health.status:
                return Probe(Readiness.LOADING if resp.status == 503 else Readiness.UNHEALTHY,
                             f"{health.path}: HTTP {resp.status}")
        if health.completion:
            body = {"model": self.options.served_model or self.target.name, "prompt": "Hi",
                    "max_tokens": 1}
            async with http.post(f"{self.base_url}/v1/completions", json=body,
                                 headers=self.auth_headers()) as resp:
                if resp.status != 200:
                    return Probe(Readiness.LOADING, f"/v1/completions: HTTP {resp.status}")
        return Probe(Readiness.READY)

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        metrics = self.options.metrics
        if metrics is None:
            return None
        async with http.get(f"{self.base_url}{metrics.path}",
                            headers=self.auth_headers()) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
            started = resp.headers.get("Process-Start-Time-Unix")
        if metrics.names == "vllm":
            return vllm_counters(text)
        return llamacpp_counters(text, float(started) if started else None)


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(CommandBackend)
