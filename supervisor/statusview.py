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


def _acceptance(target: dict[str, Any]) -> str:
    m = target.get("metrics") or {}
    if not m.get("draft_tokens"):
        return "-"
    return f"{m['accepted_tokens']}/{m['draft_tokens']} ({100 * m['accepted_tokens'] / m['draft_tokens']:.0f}%)"


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
    rows = [("TARGET", "STATE", "PID", "UPTIME", "RESTARTS", "DRAFTS ACCEPTED", "LAST EVENT")]
    for t in status.get("targets", []):
        rows.append((t["name"], t["state"], str(t.get("pid") or "-"), _uptime(t, now),
                     str(t.get("restarts", 0)), _acceptance(t), _last_event(t, now)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [head, ""]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
                     + "  " + row[-1])
    for t in status.get("targets", []):
        if t["state"] in ("failed", "backoff") and t.get("failure_output"):
            lines += ["", f"{t['name']}: last output of the runtime ({t.get('log_file')}):"]
            lines += ["    " + ln for ln in t["failure_output"].splitlines()[-12:]]
    if not status.get("targets"):
        lines.append("(no targets)")
    return "\n".join(lines)
