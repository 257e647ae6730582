"""A target's status snapshot, taken from its owner (owner.py) for status.json, the API
and /metrics: what runs, how it speculates, what the views show (tuning/quantities.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from supervisor.supervision.status import TargetStatus, counters_view
from supervisor.tuning.quantities import shown

if TYPE_CHECKING:
    from supervisor.supervision.runs import TargetRuns


def snapshot(owner: TargetRuns) -> TargetStatus:
    spec = owner.target.speculation
    speculating = owner.tuner.speculation_on if spec.method != "none" else False
    length = owner.tuner.draft_length if spec.method != "none" else None
    # The length it really runs with: the runtime's own default when none is set.
    effective = length if length is not None or spec.method == "none" \
        else owner.tuner.launch_backend().default_length()
    tunable = owner.backend.tunable_length() or (
        "nothing to tune for this method" if spec.method != "none" else None)
    alive = owner.process is not None and owner.process.returncode is None
    window = owner.tuner.window.stats()  # the tuner's evidence, across its servers
    # What the current server did, never the previous process's (a restart beside it keeps
    # the tuner's window: the text's acceptance is the same, its speed is not this one's).
    current = owner.tuner.window.stats(since=owner.started_at) if owner.started_at else None
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
        shown=shown(current, owner.metrics, method=spec.method,
                    speculating=speculating, draft_length=effective, serving=owner.serving),
        metrics=counters_view(owner.metrics), tuning=owner.tuner.view(window),
        retunes=owner.tuner.retunes, log_file=owner.log_file, placement=dict(owner.placement),
        resources=dict(owner.resources) if alive else {}, warnings=list(owner.pairing.warnings),
        requests=owner.requests.view(), by_load=owner.tuner.by_load.view(),
        on_demand=owner.loading.view(), modelkit=owner.kit)
