"""Render the status file as the table `specfleet status` prints; pure formatting."""

from __future__ import annotations

import shlex
import textwrap
import time
from typing import Any

from supervisor.config.measures import format_duration
from supervisor.supervision import labels


def _acceptance(target: dict[str, Any]) -> str:
    """Acceptance rate and mean accepted length (tokens per drafted step), as /metrics has them."""
    rate, mean = labels.acceptance(target), labels.accepted_length(target)
    return "-" if rate == labels.NONE else f"{rate} {mean}"


def _gpus(daemon: dict[str, Any]) -> list[str]:
    rows = labels.gpus(daemon)
    if isinstance(rows, str):
        return [f"GPUs: {rows}"]
    return [f"GPU {d['index']} {d['name']}: {d['free']} free of {d['total']}"
            + (f", {d['utilization']} busy" if d["utilization"] != labels.NONE else "")
            + (f", {d['temperature']}" if d["temperature"] != labels.NONE else "")
            for d in rows]


COLUMNS = ("TARGET", "STATE", "PID", "UPTIME", "RESTARTS", "SPECULATION", "ACCEPTED", "SPEED",
           "MEMORY", "LAST EVENT")
# On a narrow terminal these go first, in this order; TARGET, STATE and LAST EVENT (shortened
# with an ellipsis) always stay, and `specfleet status --target NAME` shows everything.
DROP_FIRST = ("MEMORY", "PID", "UPTIME", "SPEED", "ACCEPTED", "SPECULATION", "RESTARTS")
LAST_EVENT_MIN = 24  # what is left of the last event before more columns are dropped
GAP = "  "


def _cut(text: str, width: int | None) -> str:
    if width and len(text) > width:
        return text[:max(width - 1, 0)].rstrip() + "…"
    return text


def _wrap(text: str, width: int | None) -> list[str]:
    """Prose lines (the heading, notes) wrap at words; paths are never broken."""
    if not width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent="    ", break_long_words=False,
                         break_on_hyphens=False) or [""]


def _table(rows: list[tuple[str, ...]], width: int | None) -> list[str]:
    """Aligned rows, each at most `width` wide (None: as wide as they are)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    shown = list(range(len(COLUMNS) - 1))  # the fixed columns before LAST EVENT
    if width:
        last = min(widths[-1], LAST_EVENT_MIN)
        for name in DROP_FIRST:
            if sum(widths[i] + len(GAP) for i in shown) + last <= width:
                break
            shown.remove(COLUMNS.index(name))
    return [_cut(GAP.join(row[i].ljust(widths[i]) for i in shown) + GAP + row[-1], width)
            for row in rows]


def _heading(daemon: dict[str, Any], alive: bool, now: float) -> str:
    if alive:
        return (f"specfleet {daemon.get('version', '?')} daemon pid {daemon.get('pid')}, "
                f"up {labels.daemon_display(daemon, now)['uptime']}, "
                f"fleet {daemon.get('fleet_file')}")
    return (f"specfleet daemon is not running (last status written "
            f"{format_duration(now - daemon.get('updated', now))} ago by pid "
            f"{daemon.get('pid')}); states below are as it left them")


def _rejected_reload(daemon: dict[str, Any], now: float) -> list[str]:
    """The last rejected reload, until a reload succeeds (the fleet runs as before)."""
    rejected = daemon.get("rejected_reload")
    if not isinstance(rejected, dict) or not rejected.get("problems"):
        return []
    problems = [str(p) for p in rejected["problems"]]
    when = format_duration(now - float(rejected.get("time") or now))
    lines = [f"reload rejected {when} ago: {len(problems)} problem(s) in "
             f"{rejected.get('file')}; the fleet runs as before the reload:"]
    lines += ["    " + p for p in problems[:5]]
    if len(problems) > 5:
        lines.append(f"    ... and {len(problems) - 5} more (specfleet check FILE lists them)")
    return lines


def _notes(targets: list[dict[str, Any]]) -> list[str]:
    lines = []
    for t in targets:
        tunable = (t.get("speculation") or {}).get("tunable")
        tuning = t.get("tuning") or {}
        if decision := tuning.get("pending"):
            waits = tuning.get("waiting_for") or "the restart"
            lines.append(f"{t['name']}: tuning decision ({decision}) waiting for {waits}")
        if tunable and tunable.startswith("nothing"):
            lines.append(f"{t['name']}: {tunable}")
        for warning in t.get("warnings") or []:
            lines.append(f"{t['name']}: warning: {warning}")
    return lines


def render(status: dict[str, Any], alive: bool, now: float | None = None,
           width: int | None = None) -> str:
    """The status as a table; with `width`, every line but the runtime's own output (shown
    verbatim) fits in that many columns."""
    now = time.time() if now is None else now
    daemon = status.get("daemon", {})
    targets = status.get("targets", [])
    rows = [COLUMNS]
    for t in targets:
        # With the daemon gone nobody watches the targets: their last known state, marked
        # as such (systemd units may still run; a process launcher's children are gone).
        state = t["state"] if alive else f"was {t['state']}"
        rows.append((t["name"], state, str(t.get("pid") or "-"), labels.uptime(t, now),
                     labels.restarts(t, short=True), labels.speculation(t), _acceptance(t),
                     labels.speed(t), labels.memory(t), labels.last_event(t, now)))
    lines = _wrap(_heading(daemon, alive, now), width)
    for gpu in _gpus(daemon) if alive else []:
        lines += _wrap(gpu, width)
    for line in _rejected_reload(daemon, now):
        lines += _wrap(line, width)
    lines += ["", *_table(rows, width)]
    for t in targets:
        if t["state"] in ("failed", "backoff", "waiting") and t.get("failure_output"):
            lines += ["", *_wrap(f"{t['name']}: last output of the runtime "
                                 f"({t.get('log_file')}):", width)]
            lines += ["    " + ln for ln in t["failure_output"].splitlines()[-12:]]
    for note in _notes(targets):
        lines += _wrap(note, width)
    if not targets:
        lines.append("(no targets)")
    return "\n".join(lines)


def _by_load(by_load: dict[str, Any]) -> list[str]:
    """The tuning window per concurrency bucket (tuning/load.py)."""
    if not by_load:
        return []
    rows = [("  by load", "requests", "time", "server tok/s", "tok/s per req", "accepted")]
    for label, b in by_load.items():
        share, rate = b.get("time_share"), b.get("acceptance_rate")
        rows.append(("", label, "-" if share is None else f"{100 * share:.0f}%",
                     "-" if b.get("throughput") is None else f"{b['throughput']:.1f}",
                     "-" if b.get("tokens_per_second") is None
                     else f"{b['tokens_per_second']:.1f}",
                     "-" if rate is None else f"{100 * rate:.0f}%"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def _on_demand(view: dict[str, Any]) -> list[str]:
    """Loading on demand (docs/on-demand.md), for targets that use it."""
    if view.get("start", "always") == "always" and view.get("idle_unload") is None \
            and not view.get("group"):
        return []
    unloads = ", ".join(f"{n} {why}" for why, n in (view.get("unloads") or {}).items())
    cold = view.get("cold_start_s")
    line = (f"  on demand    start {view.get('start')}, loads {view.get('loads', 0)}, "
            f"unloads {unloads or 0}, last cold start "
            + (f"{cold:.2f} s" if cold is not None else "-"))
    extra = [f"idle_unload {format_duration(view['idle_unload'])}"] \
        if view.get("idle_unload") else []
    extra += [f"group {view['group']}"] if view.get("group") else []
    extra += ["pinned (evictable: false)"] if view.get("evictable") is False else []
    return [line] + ([f"               {', '.join(extra)}"] if extra else []) + (
        [f"  not loading  {view['load_refused']}"] if view.get("load_refused") else [])


def _why(why: dict[str, Any] | None, now: float) -> list[str]:
    """Why the tuner runs this setting (GET /v1/targets/{name}/tuning, tuning/evidence.py)."""
    if not why or not why.get("enabled"):
        return []
    lines = ["", f"why this setting: {why.get('summary')}"]
    if why.get("waiting_for"):
        lines.append(f"  waiting for  {why['waiting_for']}")
    if cost := why.get("cost"):
        lines.append(f"  a step costs {cost['plain_ms']:.1f} ms plain; drafted {cost['step_ms']:.1f} ms "
                     f"+ {cost['per_draft_ms']:.2f} ms a drafted token + "
                     f"{cost['per_accepted_ms']:.2f} ms an accepted token"
                     + ("" if cost.get("calibrated") else " (not calibrated)"))
    for c in why.get("classes") or []:
        lines.append(f"  class        {c['name']}: {100 * c['share']:.0f} % of the mix, first drafted "
                     f"token accepted {100 * c['p0']:.0f} %, each next {100 * c['rho']:.0f} % "
                     f"({c['steps']} drafted steps)")
    if predicted := why.get("predicted"):
        lines.append("  predicted    " + "  ".join(
            f"{p['setting']} {p['mid']:.2f}x" + (" (running)" if p.get("running") else "")
            for p in predicted) + " (speculation off = 1.00x)")
    for d in why.get("decisions") or []:
        lines.append(f"  {format_duration(now - d['time'])} ago  {d.get('old')} -> {d.get('new')}: "
                     f"{d['reason']}" + (f"; {d['expectation']}" if d.get("expectation") else "")
                     + f"; {d.get('cost')}")
    return lines


def render_target(target: dict[str, Any], record: dict[str, Any] | None,
                  why: dict[str, Any] | None = None, now: float | None = None) -> str:
    """One target in detail, with the record of what actually ran at its last launch."""
    now = time.time() if now is None else now
    lines = [f"{target['name']}: {target['state']} ({labels.last_event(target, now)})",
             f"  endpoint     {target.get('endpoint')}  backend {target.get('backend')}",
             f"  pid          {target.get('pid') or '-'}  up {labels.uptime(target, now)}",
             f"  restarts     {labels.restarts(target)}",
             f"  speculation  {labels.speculation(target)}  accepted {_acceptance(target)}  "
             f"speed {labels.speed(target)}",
             f"  memory       {labels.memory(target)}"]
    if target.get("modelkit"):
        lines.append(f"  modelkit     {labels.source(target)}")
    placement = target.get("placement") or {}
    if placement.get("node"):  # launcher: ray
        lines.append(f"  node         {placement['node']}, GPUs there: "
                     f"{placement.get('node_gpus') or 'none'}")
    if placement.get("gpus"):
        lines.append(f"  placement    GPU {','.join(map(str, placement.get('gpus', [])))}"
                     + (f", memory fraction {placement['memory_fraction']}"
                        if placement.get("memory_fraction") else ""))
    for warning in target.get("warnings") or []:
        lines.append(f"  warning      {warning}")
    lines += _on_demand(target.get("on_demand") or {})
    lines += _by_load(target.get("by_load") or {})
    if warming := (target.get("tuning") or {}).get("warming_tokens_left"):
        lines.append(f"  tuning       the drafter is warming up after its start: judged after "
                     f"{warming} more tokens")
    lines += _why(why, now)
    if record is None:
        lines.append("  (no run record: the target has not been launched)")
    else:
        lines += ["", f"what ran (launched {format_duration(now - record['started'])} ago, "
                      f"pid {record['pid']}, {record['reason']}):",
                  f"  runtime      {record['runtime'].get('binary')} "
                  f"(version {record['runtime'].get('version')})",
                  f"  launcher     {record.get('launcher')}",
                  f"  argv         {shlex.join(record['argv'])}"]
        if record.get("env"):
            lines.append("  env          " + " ".join(f"{k}={v}" for k, v in record["env"].items()))
        for role, f in (record.get("files") or {}).items():
            digest = f.get("sha256") or "(being computed)"
            lines.append(f"  {role:<12} {f['path']}  sha256 {digest}")
        if kit := record.get("modelkit"):
            package = " ".join((kit.get("package") or {}).values()) or "no package"
            lines.append(f"  from         {kit['reference']} = {kit['manifest_digest']} "
                         f"({package}); layers " + ", ".join(
                             f"{r} {d}" for r, d in (kit.get("layers") or {}).items()))
        gpus = record.get("gpus") or {}
        lines.append(f"  gpus         {gpus.get('gpus', 'not placed by specfleet')}")
    if target["state"] in ("failed", "backoff", "waiting") and target.get("failure_output"):
        lines += ["", f"last output of the runtime ({target.get('log_file')}):"]
        lines += ["    " + ln for ln in target["failure_output"].splitlines()[-12:]]
    return "\n".join(lines)
