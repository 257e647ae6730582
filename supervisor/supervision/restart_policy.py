"""Restart policy: pure functions of the crash history and the target's settings.

Defaults (see docs/fleet-file.md): first restart after 2 s, doubling up to 5 min,
±20 % jitter so that targets that crashed together do not restart in lockstep;
the 5th crash within 10 minutes ends in `failed`. A failure the runtime itself
calls permanent (it could not load the model, it rejected its arguments) is not
retried: the same start would fail the same way.

Out of memory is retried at most once per crash window, and only when the VRAM
planner says the target fits now (or cannot tell, without GPU readings): memory
held by a neighbour that was itself restarting may be free again, but a second
out-of-memory death means the target does not fit, and restarting it again would
be the endless loop that supervisord-style supervisors fall into.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.config.measures import format_duration
from supervisor.config.schema import Restart
from supervisor.plugin.backend import Failure, FailureKind

MAX_OOM_RESTARTS = 1  # per crash window


@dataclass(frozen=True)
class RestartDecision:
    give_up: bool
    delay: float
    reason: str


def recent_crashes(crash_times: tuple[float, ...], now: float, window: float) -> int:
    return sum(1 for t in crash_times if now - t <= window)


def after_failure(failure: Failure, crash_times: tuple[float, ...], now: float,
                  settings: Restart, rand: float, *, oom_times: tuple[float, ...] = (),
                  fits_now: bool | None = None, fit_detail: str = "") -> RestartDecision:
    """Decide what follows a failure. `crash_times` includes this one; `rand` is in [0, 1).
    For out-of-memory failures, `oom_times` (this one included) and the planner's verdict
    `fits_now` (None: it cannot tell) with its numbers in `fit_detail`."""
    if not failure.retryable:
        return RestartDecision(True, 0.0, f"{failure.summary}; not restarting: the same start "
                               "would fail the same way (fix it, then reload or restart)")
    n = recent_crashes(crash_times, now, settings.window)
    if failure.kind == FailureKind.OUT_OF_MEMORY:
        ooms = recent_crashes(oom_times, now, settings.window)
        if ooms > MAX_OOM_RESTARTS:
            return RestartDecision(True, 0.0, f"{failure.summary}; out of memory {ooms} times "
                                   f"within {format_duration(settings.window)}: not restarting "
                                   "into the same failure (free memory, lower the context or "
                                   "move the target, then reload or restart)")
        if fits_now is False:
            return RestartDecision(True, 0.0, f"{failure.summary}; not restarting: it does not "
                                   f"fit now either ({fit_detail})")
    if n >= settings.max_crashes:
        return RestartDecision(True, 0.0, f"{failure.summary}; {n} crashes within "
                               f"{format_duration(settings.window)}: giving up (crash loop)")
    delay = min(settings.backoff_max,
                settings.backoff_initial * settings.backoff_multiplier ** (n - 1))
    delay *= 1.0 + settings.jitter * (2.0 * rand - 1.0)
    if failure.kind == FailureKind.OUT_OF_MEMORY:
        why = ("the VRAM planner says it fits now" if fits_now else
               "the VRAM planner cannot check without GPU readings")
        return RestartDecision(False, max(0.0, delay), f"{failure.summary}; one restart after "
                               f"out of memory ({why}), in {delay:.1f}s; a second one within "
                               f"{format_duration(settings.window)} ends in failed")
    return RestartDecision(False, max(0.0, delay),
                           f"{failure.summary}; restart {n} of {settings.max_crashes - 1} "
                           f"allowed within {format_duration(settings.window)}, in {delay:.1f}s")
