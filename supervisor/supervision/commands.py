"""What other tasks may ask of a target's owner task, and what the owner does next.

Commands go through the owner's queue; `next_step` is the one place that says what
each command means in each phase of the target (idle, backing off, running), so the
meaning of, say, RETUNE cannot differ between loops.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Command(enum.Enum):
    START = "start"  # load an unloaded target (on demand); nothing for one that runs
    UNLOAD = "unload"  # drain in-flight requests, stop, and wait unloaded for the next START
    RESTART = "restart"  # a planned restart (drain in-flight requests, stop, start), or a start
    RETUNE = "retune"  # apply the tuner's pending decision to the next launch, then as RESTART
    SHUTDOWN = "shutdown"  # stop the process and end the owner task
    DETACH = "detach"  # end the owner task and leave the process running (systemd units)
    # A reload changed the target: run the new definition, beside the serving server where
    # it may (as a retune), else in place; or unloaded (`Request.unloaded`).
    REDEFINE = "redefine"


@dataclass(frozen=True)
class Request:
    command: Command
    reason: str
    # REDEFINE's server.Definition (not imported: what it holds imports this module).
    definition: Any = None
    unloaded: bool = False  # REDEFINE: the new definition waits for a request to load


class Phase(enum.Enum):
    IDLE = "idle"  # stopped or failed: no process
    BACKOFF = "backoff"  # crashed, waiting for the next start
    RUNNING = "running"  # a process runs (loading, ready or degraded)


class Next(enum.Enum):
    """What the owner task does after a command."""

    RUN = "run"  # (re)start the process
    IDLE = "idle"  # no process; wait for a command
    UNLOADED = "unloaded"  # no process, on purpose; wait for a command (START loads it)
    KEEP = "keep"  # nothing changes: the process runs on
    SERVE = "serve"  # a new server started beside the old one took over: supervise it
    EXIT = "exit"  # end the owner task (the process stopped, or left running for DETACH)


# The whole table. RETUNE applies the pending decision first in every phase; it then
# restarts a running target, starts one that was backing off, and leaves a stopped one
# stopped (the decision applies when it next starts). START loads a target that does not
# run and leaves one that runs alone; UNLOAD stops a target without counting a restart.
# (An idle target that is failed stays failed on UNLOAD: the owner checks its state.)
_TABLE: dict[Phase, dict[Command, Next]] = {
    Phase.IDLE: {Command.START: Next.RUN, Command.UNLOAD: Next.UNLOADED,
                 Command.RESTART: Next.RUN, Command.RETUNE: Next.IDLE,
                 Command.SHUTDOWN: Next.EXIT, Command.DETACH: Next.EXIT,
                 Command.REDEFINE: Next.RUN},
    Phase.BACKOFF: {Command.START: Next.RUN, Command.UNLOAD: Next.UNLOADED,
                    Command.RESTART: Next.RUN, Command.RETUNE: Next.RUN,
                    Command.SHUTDOWN: Next.EXIT, Command.DETACH: Next.EXIT,
                    Command.REDEFINE: Next.RUN},
    Phase.RUNNING: {Command.START: Next.KEEP, Command.UNLOAD: Next.UNLOADED,
                    Command.RESTART: Next.RUN, Command.RETUNE: Next.RUN,
                    Command.SHUTDOWN: Next.EXIT, Command.DETACH: Next.EXIT,
                    Command.REDEFINE: Next.RUN},
}


def next_step(phase: Phase, command: Command) -> Next:
    return _TABLE[phase][command]


def step_for(phase: Phase, request: Request) -> Next:
    """`next_step`, with a REDEFINE that asks to wait unloaded doing so."""
    step = next_step(phase, request.command)
    if request.command is Command.REDEFINE and request.unloaded and step is Next.RUN:
        return Next.UNLOADED
    return step


def is_planned_restart(command: Command) -> bool:
    """Commands that stop a running process on purpose: in-flight requests are drained."""
    return command in (Command.RESTART, Command.RETUNE, Command.UNLOAD, Command.REDEFINE)


def counts_as_restart(command: Command) -> bool:
    """Loads on demand are counted apart from restarts (they are not failures or changes);
    a new definition starts its count afresh (owner._define)."""
    return command not in (Command.START, Command.REDEFINE)
