"""The values that pass between a backend and the rest of specfleet: the command to run
(`LaunchSpec`, what a launcher starts), readiness probes, generations, metrics samples,
failures and what preflight found."""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.atomicfile import write_text


@dataclass(frozen=True)
class LaunchSpec:
    """What to execute. `env` is added to the daemon's environment; secrets never go in argv."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: frozenset[str] = frozenset()  # names in env whose values must not be shown
    files: Mapping[str, str] = field(default_factory=dict)  # path -> content, written first
    cwd: str | None = None
    # What asks the server to stop, before `restart.stop_grace` and SIGKILL: a name as
    # systemd's KillSignal= and podman's --stop-signal take it (a server may want SIGINT).
    stop_signal: str = "SIGTERM"

    def write_files(self) -> None:
        """Write the files the launch needs (an Ollama Modelfile), each atomically."""
        for path, content in self.files.items():
            write_text(Path(path), content)

    def shell_line(self) -> str:
        """The command as a sysadmin would type it; secret values masked."""
        env = " ".join(f"{k}={'***' if k in self.secret_env else shlex.quote(v)}"
                       for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


class Readiness(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    # The runtime says it will not serve again while this process lives (vLLM's /health 503
    # once its engine died): restarted at once as a crash, without waiting for failures.
    DEAD = "dead"


@dataclass(frozen=True)
class Probe:
    readiness: Readiness
    detail: str = ""


@dataclass(frozen=True)
class Generation:
    """One completion as measured by the runtime (or by the wall clock, if it reports nothing)."""

    text: str
    tokens: int
    seconds: float  # generation time, prompt processing excluded where the runtime says
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class MetricsSample:
    """Cumulative counters as the runtime reports them at one instant."""

    process_start: float | None = None  # resets of all counters are detected by a change here
    drafts: int = 0  # verification steps that carried a draft
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    tokens_predicted: int = 0
    tokens_predicted_seconds: float = 0.0
    prompt_tokens: int = 0
    requests_processing: int = 0
    requests_deferred: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_second(self) -> float | None:
        if self.tokens_predicted_seconds <= 0:
            return None
        return self.tokens_predicted / self.tokens_predicted_seconds


class FailureKind(enum.Enum):
    CRASH = "crash"
    HANG = "hang"
    START_TIMEOUT = "start_timeout"
    LOAD_ERROR = "load_error"  # the runtime could not load the model: retrying will not help
    BAD_ARGUMENTS = "bad_arguments"
    OUT_OF_MEMORY = "out_of_memory"
    PORT_IN_USE = "port_in_use"
    REFUSED = "refused"  # the pairing guard or the VRAM planner refused the start
    UNREACHABLE = "unreachable"  # what it runs on did not answer (a Ray head that is down)


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    summary: str
    retryable: bool = True


@dataclass(frozen=True)
class RuntimeInfo:
    binary: str
    version: str = "unknown"
    # What this build can do beyond the contract, found at preflight, e.g. LENGTHS_BY_LOAD.
    features: frozenset[str] = frozenset()


# A feature: the runtime takes a table of draft lengths by requests running at start
# (vLLM's num_speculative_tokens_per_batch_size); see `VllmBackend.with_lengths_by_load`
# (the tuner runs one length today).
LENGTHS_BY_LOAD = "lengths_by_load"
