"""Read Prometheus text exposition with prometheus-client's own parser."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Samples:
    """Samples by full sample name; each a list of (labels, value)."""

    by_name: dict[str, list[tuple[dict[str, str], float]]]

    def total(self, name: str, **labels: str) -> float:
        """Sum of every sample of `name` whose labels include `labels` (e.g. across engines)."""
        return sum(v for lab, v in self.by_name.get(name, ())
                   if all(lab.get(k) == want for k, want in labels.items()))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Values of `name` summed per value of `label`."""
        out: dict[str, float] = {}
        for lab, v in self.by_name.get(name, ()):
            if label in lab:
                out[lab[label]] = out.get(lab[label], 0.0) + v
        return out

    def __contains__(self, name: str) -> bool:
        return name in self.by_name


def parse(text: str) -> Samples:
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for sample in _samples(text):
        by_name.setdefault(sample[0], []).append((sample[1], sample[2]))
    return Samples(by_name)


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, dict(s.labels), float(s.value)


def dense_positions(per_pos: dict[str, float]) -> tuple[int, ...]:
    """Counts indexed by draft position; a position the runtime did not list counts 0."""
    if not per_pos:
        return ()
    counts = {int(k): int(v) for k, v in per_pos.items()}
    return tuple(counts.get(i, 0) for i in range(max(counts) + 1))
