"""What other tasks may ask of a target's owner task, and what the owner does next.

Commands go through the owner's queue; `next_step` is the one place that says what
each command means in each phase of the target (idle, backing off, running), so the
meaning of, say, RETUNE cannot differ between loops.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Command(enum.Enum):
    # (Nothing stops a target and keeps its owner task yet; on-demand loading will add
    # START and STOP here, with their rows in the table below.)
    RESTART = "restart"  # a planned restart (drain in-flight requests, stop, start), or a start
    RETUNE = "retune"  # apply the tuner's pending decision to the next launch, then as RESTART
    SHUTDOWN = "shutdown"  # stop the process and end the owner task
    DETACH = "detach"  # end the owner task and leave the process running (systemd units)


@dataclass(frozen=True)
class Request:
    command: Command
    reason: str


class Phase(enum.Enum):
    IDLE = "idle"  # stopped or failed: no process
    BACKOFF = "backoff"  # crashed, waiting for the next start
    RUNNING = "running"  # a process runs (loading, ready or degraded)


class Next(enum.Enum):
    """What the owner task does after a command."""

    RUN = "run"  # (re)start the process
    IDLE = "idle"  # no process; wait for a command
    EXIT = "exit"  # end the owner task (the process stopped, or left running for DETACH)


# The whole table. RETUNE applies the pending decision first in every phase; it then
# restarts a running target, starts one that was backing off, and leaves a stopped one
# stopped (the decision applies when it next starts).
_TABLE: dict[Phase, dict[Command, Next]] = {
    Phase.IDLE: {Command.RESTART: Next.RUN, Command.RETUNE: Next.IDLE,
                 Command.SHUTDOWN: Next.EXIT, Command.DETACH: Next.EXIT},
    Phase.BACKOFF: {Command.RESTART: Next.RUN, Command.RETUNE: Next.RUN,
                    Command.SHUTDOWN: Next.EXIT, Command.DETACH: Next.EXIT},
    Phase.RUNNING: {Command.RESTART: Next.RUN, Command.RETUNE: Next.RUN,
                    Command.SHUTDOWN: Next.EXIT, Command.DETACH: Next.EXIT},
}


def next_step(phase: Phase, command: Command) -> Next:
    return _TABLE[phase][command]


def is_planned_restart(command: Command) -> bool:
    """Commands that restart a running process on purpose: in-flight requests are drained."""
    return command in (Command.RESTART, Command.RETUNE)
