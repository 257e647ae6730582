"""A target's status snapshot, taken from its owner (owner.py) for status.json, the API
and /metrics: what runs, how it speculates, what the views show (tuning/quantities.py)."""

from __future__ import annotations

from typing import Any, Protocol

from supervisor.config.schema import Target
from supervisor.events import Event
from supervisor.plugin.backend import Backend, MetricsSample
from supervisor.plugin.launching import RunningProcess
from supervisor.supervision.crashes import CrashHistory
from supervisor.supervision.explain import PairingWarnings
from supervisor.supervision.ondemand import OnDemandBook
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.states import State
from supervisor.supervision.status import TargetStatus, counters_view
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.quantities import shown


class Owner(Protocol):
    """What of the owner (owner.TargetSupervisor) the snapshot reads."""

    name: str
    target: Target
    backend: Backend
    tuner: AutoTuner
    process: RunningProcess | None
    state: State
    since: float
    started_at: float | None
    crashes: CrashHistory
    last_event: Event | None
    failure_output: str | None
    runtime: dict[str, str]
    metrics: MetricsSample | None
    serving: bool
    log_file: str | None
    placement: dict[str, Any]
    resources: dict[str, Any]
    pairing: PairingWarnings
    requests: ProxyRequests
    loading: OnDemandBook
    kit: dict[str, Any] | None


def snapshot(owner: Owner) -> TargetStatus:
    spec = owner.target.speculation
    speculating = owner.tuner.speculation_on if spec.method != "none" else False
    length = owner.tuner.draft_length if spec.method != "none" else None
    # The length it really runs with: the runtime's own default when none is set.
    effective = length if length is not None or spec.method == "none" \
        else owner.tuner.launch_backend().default_length()
    tunable = owner.backend.tunable_length() or (
        "nothing to tune for this method" if spec.method != "none" else None)
    alive = owner.process is not None and owner.process.returncode is None
    window = owner.tuner.window.stats()  # once: both views below read it
    return TargetStatus(
        name=owner.name, backend=owner.target.backend, endpoint=owner.backend.base_url,
        model=owner.target.model, state=owner.state.value, since=owner.since,
        pid=owner.process.pid if alive and owner.process else None,
        started_at=owner.started_at, restarts=owner.crashes.restarts,
        restarts_by_reason=dict(owner.crashes.by_reason),
        last_event=owner.last_event.to_dict() if owner.last_event else None,
        failure_output=owner.failure_output, runtime=dict(owner.runtime),
        speculation={"method": spec.method, "variant": owner.tuner.variant,
                     "enabled": speculating,
                     "draft_length": length, "tunable": tunable},
        shown=shown(window, owner.metrics, method=spec.method,
                    speculating=speculating, draft_length=effective, serving=owner.serving),
        metrics=counters_view(owner.metrics), tuning=owner.tuner.view(window),
        retunes=owner.tuner.retunes, log_file=owner.log_file, placement=dict(owner.placement),
        resources=dict(owner.resources) if alive else {}, warnings=list(owner.pairing.warnings),
        requests=owner.requests.view(), by_load=owner.tuner.by_load.view(),
        on_demand=owner.loading.view(), modelkit=owner.kit)
