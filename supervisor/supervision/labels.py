"""Every label shown for a target, computed in one place from its status (snapshot.py).

`specfleet status` prints these, the API hands them out as each target's `display` block
and the status page shows that block as it is: the three cannot disagree on how a
speculation setting is named, how long "up" is or how a percentage is rounded. Pure:
a status dict in, strings out; "-" where there is nothing to show.
"""

from __future__ import annotations

import time
from typing import Any

from supervisor.config.measures import format_duration
from supervisor.supervision.states import is_live

NONE = "-"


def _live(target: dict[str, Any]) -> bool:
    return is_live(target.get("state"))


def _shown(target: dict[str, Any]) -> dict[str, Any]:
    """The measured quantities (tuning/quantities.py), only while the target is live."""
    return (target.get("shown") or {}) if _live(target) else {}


def method_name(target: dict[str, Any]) -> str:
    """The method with its n-gram variant: "ngram-mod", "draft", "none"."""
    spec = target.get("speculation") or {}
    method = spec.get("method", "none")
    return f"ngram-{spec.get('variant') or 'mod'}" if method == "ngram" else method


def speculation(target: dict[str, Any]) -> str:
    """What the server speculates with now: method, variant and draft length."""
    spec = target.get("speculation") or {}
    name = method_name(target)
    if name == "none":
        return "none"
    tuning = target.get("tuning") or {}
    if not spec.get("enabled", True):
        return f"{name}: off (tuner)"
    length = spec.get("draft_length")
    if length is None:  # the runtime's own default, where the backend knows it
        runs = (target.get("shown") or {}).get("draft_length")
        return f"{name} n={runs} (default)" if runs else f"{name} n=default"
    return f"{name} n={length}" + (" (tuned)" if tuning.get("tuned_length") is not None else "")


def uptime(target: dict[str, Any], now: float) -> str:
    if target.get("pid") and target.get("started_at"):
        return format_duration(now - target["started_at"])
    return NONE


def acceptance(target: dict[str, Any]) -> str:
    """Share of drafted tokens accepted, as a percentage."""
    rate = _shown(target).get("acceptance_rate")
    return NONE if rate is None else f"{100 * rate:.1f}%"


def accepted_length(target: dict[str, Any]) -> str:
    """Mean tokens per drafted step, the target's own token included."""
    mean = _shown(target).get("mean_accepted_length")
    return NONE if mean is None else f"{mean:.2f} tokens/step"


def speed(target: dict[str, Any]) -> str:
    tps = _shown(target).get("tokens_per_second")
    return f"{tps:.1f} tok/s" if tps else NONE


def size(n: float | None) -> str:
    """Bytes in binary units, one decimal: "1.5 GiB", "300.0 MiB"."""
    if n is None:
        return NONE
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.0f} KiB"


def memory(target: dict[str, Any]) -> str:
    """VRAM (where a GPU is read) and host RSS of the server."""
    r = (target.get("resources") or {}) if _live(target) else {}
    if not r:
        return NONE
    out = f"RSS {size(r.get('rss_bytes'))}"
    return f"VRAM {size(r['vram_bytes'])}, {out}" if r.get("vram_bytes") is not None else out


def restarts(target: dict[str, Any], short: bool = False) -> str:
    """Every restart by its reason in words; the policy's count (after failures) first.
    `short`: the count without its words, for a table column ("0 (2 retune)")."""
    by_reason = target.get("restarts_by_reason") or {}
    words = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in sorted(by_reason.items()))
    said = f"{target.get('restarts', 0)}" + ("" if short else " after failures")
    return said + (f" ({words})" if words else "")


def last_event(target: dict[str, Any], now: float) -> str:
    event = target.get("last_event")
    if not event:
        return NONE
    return f"{format_duration(now - event.get('time', now))} ago: {event.get('reason', '')}"


def source(target: dict[str, Any]) -> str:
    """Where the model came from: the file, or the ModelKit by reference and digest (with a
    pull under way, its progress)."""
    kit = target.get("modelkit")
    if not kit:
        return str(target.get("model") or NONE)
    said = f"{kit.get('reference')} @ {str(kit.get('manifest_digest', ''))[:19]}"
    if pull := kit.get("pull"):
        done, total = pull.get("done", 0), pull.get("total", 0)
        said += (f", pulling {size(done)} of {size(total)} ({done / total:.0%})" if total
                 else ", resolving")
    elif kit.get("offline"):
        said += ", from the cache (registry not reached)"
    if kit.get("signed_by"):
        said += f", signed by {kit['signed_by']}"
    return said


def display(target: dict[str, Any], now: float | None = None) -> dict[str, str]:
    """The labels of one target, as the API's `display` block carries them."""
    now = time.time() if now is None else now
    return {"speculation": speculation(target), "uptime": uptime(target, now),
            "acceptance": acceptance(target), "accepted_length": accepted_length(target),
            "speed": speed(target), "memory": memory(target), "restarts": restarts(target),
            "last_event": last_event(target, now), "source": source(target)}


def gpus(info: dict[str, Any]) -> list[dict[str, str]] | str:
    """The daemon's GPUs as rows of labels, or why none are read."""
    g = info.get("gpus") or {}
    if g.get("unavailable"):
        return str(g["unavailable"])
    return [{"index": str(d.get("index")), "name": str(d.get("name")),
             "free": size(d.get("free")), "total": size(d.get("total")),
             "utilization": NONE if d.get("utilization") is None else f"{d['utilization']}%",
             "temperature": NONE if d.get("temperature") is None else f"{d['temperature']} °C"}
            for d in g.get("gpus", [])]


def daemon_display(info: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The daemon's labels, as the API's `display` block of `daemon` carries them."""
    now = time.time() if now is None else now
    started = info.get("started")
    return {"uptime": format_duration(now - started) if started else NONE, "gpus": gpus(info)}
