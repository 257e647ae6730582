"""The tuner's decision code over a simulated afternoon (benchmarks/trace_sim.py), driven by
the step times and acceptance measured live (benchmarks/results/class_profile.json): a
regression in the controller or the rule shows here, in seconds, without a server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import trace_sim  # noqa: E402

PROFILE = json.loads((REPO / "benchmarks/results/class_profile.json").read_text())
SHORT = yaml.safe_load((REPO / "benchmarks/traces/short.yaml").read_text())


@pytest.mark.parametrize("setup", ["pair-close", "ngram"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_tuner_beats_every_fixed_setting_of_an_afternoon_and_settles_fast(setup, seed):
    r = trace_sim.simulate(PROFILE, setup, SHORT, seed)
    assert r["tuned_vs_best_fixed"] >= 1.0, r["decisions"]
    # A class never seen takes at most two restarts to settle, one seen before none.
    assert r["settle_restarts"]["new"] <= 2 and r["settle_restarts"]["seen"] == 0, \
        r["decisions"]
    assert r["worst_hour_restarts"] <= 6


def test_the_oracle_is_at_least_as_fast_as_every_fixed_setting_and_pays_its_restarts():
    r = trace_sim.simulate(PROFILE, "pair-close", SHORT, 1)
    fixed = {k: v for k, v in r["busy_s"].items() if k.startswith("fixed")}
    assert r["busy_s"]["oracle"] <= min(fixed.values())
    assert r["oracle_vs_best_fixed"] >= 1.0


def test_the_same_seed_plays_the_same_day():
    a = trace_sim.simulate(PROFILE, "ngram", SHORT, 3)
    b = trace_sim.simulate(PROFILE, "ngram", SHORT, 3)
    assert a == b
