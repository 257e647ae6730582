"""Our reader of Prometheus text reads what prometheus-client's parser reads (it replaced
that parser on the daemon's hot path: supervisor/plugin/promtext.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.plugin.promtext import parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

EDGES = r"""
# A comment that is neither HELP nor TYPE
# HELP spaced Labels with spaces, a trailing comma, braces and escapes in values.
# TYPE spaced gauge
spaced{ a = "1" , b="x}y{",} 2.5
spaced{a="quote \" backslash \\ newline \n other \t",b=""} -3e2 1700000000000
   indented_untyped   7
tabbed	1.5
# TYPE plain_counter counter
plain_counter 4
plain_counter{engine="1"} 5
# TYPE plain_counter_total counter
plain_counter_total 6
# TYPE specials gauge
specials{v="nan"} NaN
specials{v="inf"} +Inf
specials{v="-inf"} -Inf
# TYPE h histogram
h_bucket{le="+Inf"} 3
h_sum 10
h_count 3
after_family 1
empty_labels{} 8
""" + "trailing_space 9   \n"


def reference(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def same(a: dict, b: dict) -> bool:
    def norm(d: dict) -> dict:  # NaN != NaN
        return {k: sorted((sorted(lab.items()), repr(v)) for lab, v in vs) for k, vs in d.items()}
    return norm(a) == norm(b)


@pytest.mark.parametrize("text", [(FIXTURES / "llama_server_metrics.txt").read_text(),
                                  (FIXTURES / "vllm_metrics.txt").read_text(), EDGES],
                         ids=["llama-server", "vllm", "edge-cases"])
def test_samples_are_read_as_prometheus_client_reads_them(text):
    assert same(parse(text).by_name, reference(text))


def test_a_counter_named_without_total_is_read_with_it_as_prometheus_client_does():
    samples = parse((FIXTURES / "llama_server_metrics.txt").read_text())
    assert samples.total("llamacpp:n_tokens_max_total") == 46
    assert samples.total("llamacpp:tokens_predicted_total") == 24


@pytest.mark.parametrize("line", [
    "no_value", "bad name 1", 'x{a="1" b="2"} 1', 'x{a="1",a="2"} 1', 'x{a=1} 1',
    'x{a="1"', "x 1_000", "x one", '{a="1"} 1',
])
def test_a_line_neither_can_read_is_a_value_error(line):
    with pytest.raises(ValueError):
        reference(line)
    with pytest.raises(ValueError):
        parse(line)
