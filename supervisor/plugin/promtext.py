"""Read Prometheus text exposition (format 0.0.4): the samples, by name.

Our own reader, not prometheus-client's: the daemon reads every target's counters every
`metrics_interval`, and prometheus-client's parser, which walks each line character by
character, cost 0.57 ms of CPU per read of llama-server's /metrics (0.45 % of a core for
8 targets read every second); this one costs a tenth of that. It reads samples as that
parser does (tests/api/test_promtext.py holds the two together): blank lines and comments are
skipped, `name{label="value",...} value [timestamp]` is a sample, label values are
unescaped (backslash, quote, newline), a counter whose TYPE line names it without
`_total` has its samples named with it (prometheus-client's OpenMetrics naming), and a
line it cannot read is a ValueError. Metric and label names are the classic ones
(`[a-zA-Z_:][a-zA-Z0-9_:]*`), not the quoted UTF-8 names of newer exporters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# name, then labels in braces (quoted values may hold braces) or whitespace, then the
# value; a timestamp or anything else after it is not read.
_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\s*\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}\s*|\s+)'
                     r"(\S+)(?:\s.*)?")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


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
    counter = ""  # the current family, when it is a counter named without `_total`
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            counter = _counter_family(line.split(None, 3), counter)
            continue
        if not line:
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None or "_" in m.group(3):
            raise ValueError(f"not a Prometheus sample: {line[:200]!r}")
        name, labels, value = m.groups()
        if counter and name == counter:
            name += "_total"
        else:
            counter = ""  # a sample of another name starts a family of its own
        by_name.setdefault(name, []).append((_labels(labels) if labels else {}, float(value)))
    return Samples(by_name)


def _counter_family(parts: list[str], current: str) -> str:
    """The counter family after a comment line (`# HELP name ...`, `# TYPE name type`)."""
    if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
        return current
    if parts[1] == "HELP":
        return current if parts[2] == current else ""
    counter = len(parts) == 4 and parts[3] == "counter" and not parts[2].endswith("_total")
    return parts[2] if counter else ""


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.group(1) in out:
            raise ValueError(f"bad Prometheus labels: {{{text[:200]}}}")
        value = m.group(2)
        out[m.group(1)] = _ESCAPE.sub(lambda e: _UNESCAPED[e.group(0)], value) \
            if "\\" in value else value
        pos = m.end()
        if text[pos:].strip() == "":
            break
    return out


def dense_positions(per_pos: dict[str, float]) -> tuple[int, ...]:
    """Counts indexed by draft position; a position the runtime did not list counts 0."""
    if not per_pos:
        return ()
    counts = {int(k): int(v) for k, v in per_pos.items()}
    return tuple(counts.get(i, 0) for i in range(max(counts) + 1))
