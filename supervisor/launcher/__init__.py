"""How a target's process runs: the launcher interface and its implementations."""

from supervisor.launcher.base import Launcher, RunningProcess

__all__ = ["Launcher", "RunningProcess"]
