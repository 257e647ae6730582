"""A target's history samples in compact columns, for the 24 hours the status page charts.

A sample as a dict costs about 570 bytes in CPython (measured with tracemalloc: the dict,
its float objects, the key strings shared); at one sample every 5 s that is ~0.4 MB an hour
per target, ~10 MB a day each, which a months-long daemon must not grow by. Here a sample
is its time and one float per quantity in `array("d")` columns: 8 bytes each (NaN stands
for "none"), ~40 bytes a sample. The oldest are dropped by moving a head index, and the
columns are cut back once the dropped part is the larger one, so appending stays O(1)
amortised.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from typing import Any

COMPACT_AFTER = 1024  # dropped samples before the columns are cut back


class Samples:
    def __init__(self, keys: tuple[str, ...], max_points: int,
                 integral: frozenset[str] = frozenset()) -> None:
        self.keys = keys
        self.max_points = max_points
        self.integral = integral  # quantities that are counts: read back as int
        self._t = array("d")
        self._columns = [array("d") for _ in keys]
        self._head = 0

    def __len__(self) -> int:
        return len(self._t) - self._head

    def append(self, t: float, values: dict[str, Any]) -> None:
        self._t.append(t)
        for key, column in zip(self.keys, self._columns, strict=True):
            v = values.get(key)
            column.append(math.nan if v is None else float(v))
        if len(self) > self.max_points:
            self._head += 1
        self._compact()

    def drop_before(self, oldest: float) -> None:
        while self._head < len(self._t) and self._t[self._head] < oldest:
            self._head += 1
        self._compact()

    def _compact(self) -> None:
        if self._head >= COMPACT_AFTER and 2 * self._head >= len(self._t):
            for column in (self._t, *self._columns):
                del column[:self._head]
            self._head = 0

    def __iter__(self) -> Iterator[tuple[float, dict[str, Any]]]:
        for i in range(self._head, len(self._t)):
            yield self._t[i], {key: self._value(key, column[i])
                               for key, column in zip(self.keys, self._columns, strict=True)}

    def _value(self, key: str, v: float) -> float | int | None:
        if math.isnan(v):
            return None
        return int(v) if key in self.integral else v
