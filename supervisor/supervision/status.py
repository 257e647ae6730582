"""A target's status: the plain snapshot `specfleet status`, the API and /metrics show."""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field
from typing import Any

from supervisor.plugin.backend import MetricsSample


@dataclass
class TargetStatus:
    """A plain snapshot, safe to serialise (status.json, /v1/targets)."""

    name: str
    backend: str
    endpoint: str
    model: str
    state: str
    since: float
    pid: int | None = None
    started_at: float | None = None
    restarts: int = 0  # by the restart policy after failures (what crash-loop alerts want)
    restarts_by_reason: dict[str, int] = field(default_factory=dict)  # every restart, any cause
    last_event: dict[str, Any] | None = None
    failure_output: str | None = None
    runtime: dict[str, str] = field(default_factory=dict)
    speculation: dict[str, Any] = field(default_factory=dict)
    # acceptance rate, mean accepted length, tokens/s, draft length: tuning/quantities.py
    shown: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)
    retunes: int = 0
    log_file: str | None = None
    placement: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)  # VRAM, RSS, CPU (the monitor)
    warnings: list[str] = field(default_factory=list)  # the pairing guard's, at the last start
    requests: dict[str, Any] = field(default_factory=dict)  # seen by the proxy (docs/api.md)
    # the tuning window per concurrency bucket (tuning/load.py), with busy time and throughput
    by_load: dict[str, Any] = field(default_factory=dict)
    # start mode, loads and unloads, the last cold-start wait (supervision/ondemand.py)
    on_demand: dict[str, Any] = field(default_factory=dict)
    # where the model came from when a ModelKit: reference, digests, package, a pull under way
    modelkit: dict[str, Any] | None = None


def counters_view(m: MetricsSample | None) -> dict[str, Any]:
    """The runtime's cumulative counters as last read."""
    if m is None:
        return {}
    return {"drafts": m.drafts, "draft_tokens": m.draft_tokens,
            "accepted_tokens": m.accepted_tokens,
            "accepted_per_position": list(m.accepted_per_position),
            "tokens_predicted": m.tokens_predicted,
            "requests_processing": m.requests_processing}


def exit_description(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with status {code}"
