"""What a calibration beside a serving server gives way to: work on its device.

A calibration measures what a step costs by timing completions (supervision/calibration.py);
any other work on the same cores or GPU while one runs makes it read slow, and on a CPU it
also takes cores from the server that does the work. So it waits for quiet and measures
again what ran while something worked. "Something" is not only its own target's server: on
a box with several targets on the CPU, each of them computes on the same cores (a benchmark
that served five other targets in turn while one calibrated would have given it nothing but
contended steps). The mark below covers the target's own server and every other serving
target of the fleet on the same device: the same node, and a GPU in common or both on the
CPU. Pure apart from reading the owners' counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from supervisor.plugin.backend import MetricsSample
from supervisor.supervision.requests import ProxyRequests


class Worker(Protocol):
    """What this module reads of a target's owner (supervision/owner.py)."""

    requests: ProxyRequests
    metrics: MetricsSample | None
    placement: dict[str, Any]

    @property
    def serving(self) -> bool: ...


def shares_device(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two placements (the VRAM plan's, with the node where a launcher names one)
    compute on the same device: the same node, and a GPU in common or neither on a GPU. A
    target on a GPU still uses a CPU thread or two; that is not counted as sharing."""
    if a.get("node") != b.get("node"):
        return False
    ga, gb = set(a.get("gpus") or ()), set(b.get("gpus") or ())
    return bool(ga & gb) if ga and gb else not ga and not gb


def work_mark(owner: Worker) -> object:
    """Changes whenever this target's server works (the proxy's requests, the runtime's
    own counters for requests sent to its port directly); never equal while one runs."""
    m = owner.metrics
    if m is not None and m.requests_processing:
        return object()
    return owner.requests.mark(), m.tokens_predicted if m is not None else 0


def work_beside(owner: Worker, neighbours: Callable[[], Iterable[Worker]]) -> object:
    """A mark of the work on the owner's device: its own server's and each other serving
    target's there (one that starts or stops serving changes it too: loading is work)."""
    others = [n for n in neighbours()
              if n is not owner and n.serving and shares_device(owner.placement, n.placement)]
    return (work_mark(owner), *(work_mark(n) for n in others))
