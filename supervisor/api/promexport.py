"""GET /metrics: the fleet as Prometheus metrics (prometheus-client), read at scrape time.

Names and labels (docs/api.md): every per-target metric has the labels `target` and
`backend`; states are one gauge per state (1 for the current one), the convention of
kube-state-metrics, so that `specfleet_target_state{state="failed"} == 1` alerts.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, InfoMetricFamily, Metric

from supervisor import __version__
from supervisor.api.fleetview import FleetView
from supervisor.target.states import State

LABELS = ["target", "backend"]


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
            ready.add_metric(labels, 1.0 if t["state"] in ("ready", "degraded") else 0.0)
            restarts.add_metric(labels, t["restarts"])
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
        yield from (state, ready, restarts, rate, mean_len, length, tps, vram, rss)


def registry_for(fleet: FleetView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(fleet))  # type: ignore[arg-type]
    return registry
