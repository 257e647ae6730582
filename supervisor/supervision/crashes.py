"""A target's crash history and restart counts, and the restart decision after a failure
(the pure rule is restart_policy.py's; this keeps the times it is applied to)."""

from __future__ import annotations

from collections.abc import Callable

from supervisor.config.schema import Target
from supervisor.gpu.placement import Placer
from supervisor.plugin.backend import Failure, FailureKind
from supervisor.supervision import restart_policy


class CrashHistory:
    def __init__(self, target: Target, placer: Placer | None, clock: Callable[[], float],
                 rand: Callable[[], float]) -> None:
        self.target = target
        self.placer = placer
        self.clock = clock
        self.rand = rand
        self.restarts = 0  # by the restart policy, after a failure
        self.by_reason: dict[str, int] = {}  # every restart: failure kind or command
        self._crash_times: list[float] = []
        self._oom_times: list[float] = []

    def count(self, why: str, by_policy: bool = False) -> None:
        self.by_reason[why] = self.by_reason.get(why, 0) + 1
        self.restarts += by_policy

    def forget(self) -> None:
        """A manual start after giving up counts crashes anew."""
        self._crash_times, self._oom_times = [], []

    async def decide(self, failure: Failure) -> restart_policy.RestartDecision:
        """Back off and restart, or give up; an out-of-memory death asks the placer whether
        the target fits now."""
        now = self.clock()
        # Only the window counts (restart_policy.recent_crashes): older times are dropped,
        # or a daemon up for months would keep every crash it ever saw.
        window = self.target.restart.window
        self._crash_times = [t for t in self._crash_times if now - t <= window] + [now]
        fits_now, fit_detail = None, ""
        if failure.kind == FailureKind.OUT_OF_MEMORY:
            self._oom_times = [t for t in self._oom_times if now - t <= window] + [now]
            if self.placer is not None:
                fits_now, fit_detail = await self.placer.fits_now(self.target.name)
        return restart_policy.after_failure(
            failure, tuple(self._crash_times), now, self.target.restart, self.rand(),
            oom_times=tuple(self._oom_times), fits_now=fits_now, fit_detail=fit_detail)
