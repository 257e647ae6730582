"""The two values a target's owner (owner.py) replaces whole and never changes in place:

- `Definition`: the target as the fleet file defines it, with its backend on the configured
  port, its launcher, its tuner and its ModelKit's pull. A reload's change, or a ModelKit
  pulled to its files, is a new definition.
- `Server`: one start of that definition: the process, the backend it listens on (the
  configured port, or one beside an older server), when it started, the runtime that
  runs it and its placement. A start in place or a server started beside the old one is a
  new value; what status shows of a server (its counters, memory, speed) is read only
  from the current one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from supervisor.config.schema import Target
from supervisor.plugin.backend import Backend, LaunchSpec
from supervisor.plugin.launching import Launcher, RunningProcess
from supervisor.tuning.autotuner import AutoTuner

if TYPE_CHECKING:
    from supervisor.supervision.pulling import KitPuller


@dataclass(frozen=True)
class Definition:
    target: Target
    home: Backend  # on the configured port
    launcher: Launcher
    tuner: AutoTuner  # its memory belongs to the model's files (tuning/store.fingerprint)
    puller: KitPuller  # the ModelKit's pull, and what it pulled
    log_file: str | None = None

    @property
    def name(self) -> str:
        return self.target.name


@dataclass(frozen=True)
class Server:
    process: RunningProcess
    backend: Backend  # where it listens
    spec: LaunchSpec
    runtime: dict[str, str] = field(default_factory=dict)  # binary, version, where it runs
    placement: dict[str, Any] = field(default_factory=dict)  # GPUs, memory share, node
    started_at: float = field(default_factory=time.time)
    adopted: bool = False  # found running (a unit left by the previous daemon)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None
