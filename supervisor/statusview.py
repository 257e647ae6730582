"""Render the status file as the table `specfleet status` prints; pure formatting."""

from __future__ import annotations

import time
from typing import Any

from supervisor.config.units import format_duration


def _uptime(target: dict[str, Any], now: float) -> str:
    if target.get("pid") and target.get("started_at"):
        return format_duration(now - target["started_at"])
    return "-"


def _last_event(target: dict[str, Any], now: float) -> str:
    event = target.get("last_event")
    if not event:
        return "-"
    age = format_duration(now - event.get("time", now))
    return f"{age} ago: {event.get('reason', '')}"


def _speculation(target: dict[str, Any]) -> str:
    spec = target.get("speculation") or {}
    method = spec.get("method", "none")
    if method == "none":
        return "none"
    name = f"ngram-{spec.get('variant') or 'mod'}" if method == "ngram" else method
    phase = (target.get("tuning") or {}).get("phase")
    if phase == "baseline":
        return f"{name}: off, measuring baseline"
    if not spec.get("enabled", True):
        return f"{name}: off (tuner)"
    length = spec.get("draft_length")
    tuned = (target.get("tuning") or {}).get("tuned_length") is not None
    return f"{name} n={length if length is not None else 'default'}" + (" (tuned)" if tuned else "")


def _window(target: dict[str, Any]) -> dict[str, Any]:
    """The tuning window if tuning runs, else the cumulative counters."""
    window = (target.get("tuning") or {}).get("window")
    if window and window.get("tokens"):
        return window
    m = target.get("metrics") or {}
    return {"drafts": m.get("drafts"), "acceptance_rate": m.get("acceptance_rate"),
            "mean_accepted_length": (m["accepted_tokens"] / m["drafts"]) if m.get("drafts") else None,
            "tokens_per_second": m.get("tokens_per_second")}


def _acceptance(target: dict[str, Any]) -> str:
    w = _window(target)
    if not w.get("drafts") or w.get("acceptance_rate") is None:
        return "-"
    return f"{100 * w['acceptance_rate']:.0f}% {w['mean_accepted_length']:.1f}/step"


def _tokens_per_second(target: dict[str, Any]) -> str:
    tps = _window(target).get("tokens_per_second")
    return f"{tps:.1f}" if tps else "-"


def render(status: dict[str, Any], alive: bool, now: float | None = None) -> str:
    now = time.time() if now is None else now
    daemon = status.get("daemon", {})
    if alive:
        head = (f"specfleet {daemon.get('version', '?')} daemon pid {daemon.get('pid')}, "
                f"up {format_duration(now - daemon.get('started', now))}, "
                f"fleet {daemon.get('fleet_file')}")
    else:
        head = (f"specfleet daemon is not running (last status written "
                f"{format_duration(now - daemon.get('updated', now))} ago by pid "
                f"{daemon.get('pid')}); states below are as it left them")
    rows = [("TARGET", "STATE", "PID", "UPTIME", "RESTARTS", "SPECULATION", "ACCEPTED", "TOK/S",
             "LAST EVENT")]
    for t in status.get("targets", []):
        rows.append((t["name"], t["state"], str(t.get("pid") or "-"), _uptime(t, now),
                     str(t.get("restarts", 0)), _speculation(t), _acceptance(t),
                     _tokens_per_second(t), _last_event(t, now)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [head, ""]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
                     + "  " + row[-1])
    for t in status.get("targets", []):
        if t["state"] in ("failed", "backoff") and t.get("failure_output"):
            lines += ["", f"{t['name']}: last output of the runtime ({t.get('log_file')}):"]
            lines += ["    " + ln for ln in t["failure_output"].splitlines()[-12:]]
    for t in status.get("targets", []):
        tunable = (t.get("speculation") or {}).get("tunable")
        decision = (t.get("tuning") or {}).get("pending")
        if decision:
            lines.append(f"{t['name']}: tuning decision waiting for an idle server: {decision}")
        if tunable and tunable.startswith("nothing"):
            lines.append(f"{t['name']}: {tunable}")
    if not status.get("targets"):
        lines.append("(no targets)")
    return "\n".join(lines)
