"""Why a target may not start (the pairing guard's errors), and why its runtime's process
ended or stopped answering: in the runtime's own words where it gave them (its output),
else from the exit status."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from supervisor.errors import StartRefused
from supervisor.plugin.backend import Backend, Failure, FailureKind
from supervisor.plugin.helpers import pairing_findings
from supervisor.plugin.launching import RunningProcess
from supervisor.supervision.status import exit_description

# Lines of the runtime's output a failure is explained from: the reason can be far from
# the end (vLLM prints tracebacks, then ~40 lines of nanobind leak reports at exit).
EXPLAIN_LINES = 200


def explain_hang(backend: Backend, proc: RunningProcess, failure: Failure) -> Failure:
    """A process that stopped answering may have said why (vLLM's API server lingers,
    not listening, after its engine died): the runtime's own reason, when it gave one."""
    if failure.kind != FailureKind.HANG:
        return failure
    said = backend.explain_failure(proc.output_tail(EXPLAIN_LINES), None)
    if said is None or said.kind == FailureKind.HANG:
        return failure
    return Failure(said.kind, f"{said.summary} (then it stopped answering: "
                   f"{failure.summary})", said.retryable)


def explain_exit(backend: Backend, proc: RunningProcess, code: int) -> Failure:
    if proc.oom_killed():
        return Failure(FailureKind.OUT_OF_MEMORY, "out of host memory: killed by the "
                       "kernel's OOM killer (SIGKILL, and oom_kill rose in its cgroup's "
                       "memory.events)")
    return backend.explain_failure(proc.output_tail(EXPLAIN_LINES), code) or Failure(
        FailureKind.CRASH, f"{backend.description or backend.target.backend} "
                           f"{exit_description(code)}")


class PairingWarnings:
    """The pairing guard's warnings of a target's last start; each new set is said once, as
    events, not at every restart."""

    def __init__(self, emit: Callable[..., None]) -> None:
        self.emit = emit
        self.warnings: list[str] = []

    def __call__(self, warnings: list[str]) -> None:
        if warnings != self.warnings:
            for message in warnings:
                self.emit("pairing", message, level="warning")
        self.warnings = warnings


async def pairing_warnings(backend: Backend) -> list[str]:
    """The pairing guard's warnings; raise StartRefused with its errors (cached per file by
    the backend, so cheap after the first start)."""
    findings = await asyncio.to_thread(pairing_findings, backend)
    if errors := [f.message for f in findings if f.level == "error"]:
        raise StartRefused("; ".join(errors))
    return [f.message for f in findings if f.level == "warning"]
