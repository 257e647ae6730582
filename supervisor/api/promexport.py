"""GET /metrics: the fleet as Prometheus metrics (prometheus-client), read at scrape time.

Names and labels (docs/api.md): every per-target metric has the labels `target` and
`backend`; states are one gauge per state (1 for the current one), the convention of
kube-state-metrics, so that `specfleet_target_state{state="failed"} == 1` alerts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from supervisor import __version__
from supervisor.api.fleetview import FleetView
from supervisor.supervision.states import State, is_live

LABELS = ["target", "backend"]
# Reasons exported as 0 before they first happen, so that increase() and alerts see the
# series from the start; any other reason in a target's `restarts_by_reason` (a failure
# kind such as start_timeout or port_in_use) appears when it first counts.
USUAL_RESTART_REASONS = ("crash", "hang", "out_of_memory", "restart", "retune")


def _restarts_by_reason(target: dict[str, Any]) -> dict[str, int]:
    """Every restart of the target's process by reason: the failure kind that the restart
    policy restarted after, or the command (`restart`: the API or a reload; `retune`)."""
    counted = target.get("restarts_by_reason") or {}
    return dict(sorted({**dict.fromkeys(USUAL_RESTART_REASONS, 0), **counted}.items()))


class FleetCollector:
    def __init__(self, fleet: FleetView) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("specfleet", "The daemon.")
        info.add_metric([], {"version": __version__, "fleet_file": self.fleet.fleet_file})
        yield info
        targets = self.fleet.target_statuses()
        yield GaugeMetricFamily("specfleet_targets", "Targets in the fleet file.",
                                value=len(targets))

        def family(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=LABELS + (extra or []))

        state = family("specfleet_target_state", "1 for the target's current state.", ["state"])
        ready = family("specfleet_target_ready", "1 when the target serves requests.")
        restarts = family("specfleet_target_restarts", "Restarts by the restart policy.")
        # Not `specfleet_target_restarts_total`: one name away from the gauge above, it
        # would read as the same count, and OpenMetrics would give both one family name.
        by_reason = CounterMetricFamily(
            "specfleet_target_restarts_by_reason",
            "Every restart of the process, by reason: a failure kind or a command.",
            labels=[*LABELS, "reason"])
        rate = family("specfleet_target_acceptance_rate",
                      "Accepted / drafted tokens (tuning window, else since start).")
        mean_len = family("specfleet_target_mean_accepted_length",
                          "Tokens per verification step with a draft: 1 + accepted / drafts.")
        length = family("specfleet_target_draft_length",
                        "Draft length the runtime runs with (0: speculation off).")
        tps = family("specfleet_target_tokens_per_second", "Generation tokens per second.")
        vram = family("specfleet_target_vram_bytes", "GPU memory of the target's process tree.")
        rss = family("specfleet_target_rss_bytes", "Host memory (RSS) of the process tree.")
        for t in targets:
            labels = [t["name"], t["backend"]]
            for s in State:
                state.add_metric([*labels, s.value], 1.0 if t["state"] == s.value else 0.0)
            ready.add_metric(labels, 1.0 if is_live(t["state"]) else 0.0)
            restarts.add_metric(labels, t["restarts"])
            for reason, count in _restarts_by_reason(t).items():
                by_reason.add_metric([*labels, reason], count)
            shown = t.get("shown") or {}  # tuning/quantities.py: what status shows too
            for gauge, key in ((rate, "acceptance_rate"), (mean_len, "mean_accepted_length"),
                                 (tps, "tokens_per_second"), (length, "draft_length")):
                if shown.get(key) is not None:
                    gauge.add_metric(labels, shown[key])
            resources = t.get("resources") or {}
            if resources.get("vram_bytes") is not None:
                vram.add_metric(labels, resources["vram_bytes"])
            if resources.get("rss_bytes"):
                rss.add_metric(labels, resources["rss_bytes"])
        yield from (state, ready, restarts, by_reason, rate, mean_len, length, tps, vram, rss)
        yield from _by_load(targets, family)
        yield from _on_demand(targets, family)


def _on_demand(targets: list[dict[str, Any]],
               family: Callable[..., GaugeMetricFamily]) -> Iterator[Metric]:
    """Loads and unloads on demand (docs/on-demand.md): not restarts, counted on their own."""
    loads = CounterMetricFamily("specfleet_target_loads", "Starts on demand (a request for "
                                "an unloaded target).", labels=LABELS)
    unloads = CounterMetricFamily("specfleet_target_unloads", "Unloads, by reason: idle "
                                  "(idle_unload) or evicted (to load another target).",
                                  labels=[*LABELS, "reason"])
    cold = family("specfleet_target_cold_start_seconds", "How long the first request waited "
                  "at the last load on demand.")
    for t in targets:
        labels, view = [t["name"], t["backend"]], t.get("on_demand") or {}
        loads.add_metric(labels, view.get("loads", 0))
        for reason in ("idle", "evicted"):
            unloads.add_metric([*labels, reason], (view.get("unloads") or {}).get(reason, 0))
        if view.get("cold_start_s") is not None:
            cold.add_metric(labels, view["cold_start_s"])
    yield from (loads, unloads, cold)


def _by_load(targets: list[dict[str, Any]],
             family: Callable[..., GaugeMetricFamily]) -> Iterator[Metric]:
    """The tuning window per concurrency bucket (tuning/load.py), label `load`."""
    fams = {
        "throughput": family("specfleet_target_throughput_by_load", "Generated tokens per "
                             "busy second, all requests together, at this many requests "
                             "running.", ["load"]),
        "acceptance_rate": family("specfleet_target_acceptance_rate_by_load", "Accepted / "
                                  "drafted tokens at this many requests running.", ["load"]),
        "time_share": family("specfleet_target_load_time_share", "Share of the busy time "
                             "spent at this many requests running.", ["load"]),
    }
    for t in targets:
        for load, numbers in (t.get("by_load") or {}).items():
            for key, gauge in fams.items():
                if numbers.get(key) is not None:
                    gauge.add_metric([t["name"], t["backend"], load], numbers[key])
    yield from fams.values()


def registry_for(fleet: FleetView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(fleet))  # type: ignore[arg-type]
    return registry
