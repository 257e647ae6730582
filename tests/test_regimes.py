"""Workload regimes (tuning/regimes.py): what a search found is kept at a drift and comes
back when the workload does; and the proxy's exact busy time in the load evidence."""

from __future__ import annotations

import asyncio

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target
from supervisor.plugin.backend import MetricsSample, RuntimeInfo
from supervisor.supervision.requests import ProxyRequests
from supervisor.tuning import autotuner
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.regimes import LIMIT, recall, recall_sampled, remember, setting_key
from supervisor.tuning.store import TunerMemory

CODE = {"mod:16": 0.9}
MEASURED = {"16": {"speedup": 1.6, "draft_fraction": 0.3, "mean_draft_size": 16.0,
                   "accepted_per_draft": 14.0}}
VARIANTS = {"mod": {"length": 16, "speedup": 1.6}, "simple": {"length": 48, "speedup": 1.2}}


def test_setting_keys_name_the_variant_and_length():
    assert setting_key("mod", 16) == "mod:16"
    assert setting_key(None, None) == "-:default"


def test_a_regime_is_recalled_only_at_the_same_setting_and_close_acceptance():
    kept = remember([], CODE, "mod", MEASURED, VARIANTS, now=1.0)
    assert recall(kept, "mod:16", 0.85)["variants"] == VARIANTS
    assert recall(kept, "mod:16", 0.80) is None  # 10 points away: another workload
    assert recall(kept, "simple:48", 0.9) is None  # acceptance depends on the setting


def test_the_closest_regime_wins_and_a_matching_one_is_replaced():
    prose = remember([], {"mod:16": 0.5}, "mod", MEASURED, {}, now=1.0)
    both = remember(prose, CODE, "mod", MEASURED, VARIANTS, now=2.0)
    assert len(both) == 2 and recall(both, "mod:16", 0.56)["acceptance"] == {"mod:16": 0.5}
    again = remember(both, {"mod:16": 0.93}, "mod", {}, {"mod": VARIANTS["mod"]}, now=3.0)
    assert len(again) == 2 and recall(again, "mod:16", 0.9)["variants"] == {
        "mod": VARIANTS["mod"]}


def test_a_regime_of_other_sampling_is_not_replaced_by_an_acceptance_both_saw():
    # Run 16 of tuner_phases: code (all greedy) was left late, holding prose's first judgement
    # at length 2; prose (all sampled) judged the same length alike and must not replace it.
    code = remember([], {"-:16": 0.98, "-:2": 0.18}, None, MEASURED, {}, now=1.0,
                    greedy_share=0.95)
    both = remember(code, {"-:2": 0.13}, None, {"2": MEASURED["16"]}, {}, now=2.0,
                    greedy_share=0.0)
    assert len(both) == 2 and recall_sampled(both, 1.0)["acceptance"]["-:16"] == 0.98
    same = remember(code, {"-:2": 0.13}, None, MEASURED, {}, now=2.0, greedy_share=0.9)
    assert len(same) == 1 and same[0]["seen"] == 2.0  # the same sampling: the same regime


def test_nothing_measured_is_not_kept_and_the_oldest_go_first():
    assert remember([], CODE, "mod", {}, {}, now=1.0) == []
    assert remember([], {}, "mod", MEASURED, {}, now=1.0) == []
    kept: list = []
    for i in range(LIMIT + 2):
        kept = remember(kept, {"mod:16": i / 10 * 2}, "mod", MEASURED, {}, now=float(i))
    assert len(kept) == LIMIT and [r["seen"] for r in kept] == [2.0, 3.0, 4.0, 5.0]


def make_tuner(tmp_path, memory: TunerMemory) -> tuple[AutoTuner, list]:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    target = Target(name="t", model=str(model), port=1,
                    tuning={"min_steps": 20, "min_tokens": 100, "cooldown": 0},
                    speculation={"method": "ngram", "variant": "mod",
                                 "variants": ["mod", "simple"],
                                 "length": {"start": 16, "min": 16, "max": 16}})
    events: list = []
    tuner = AutoTuner(target, LlamaCppBackend(target), None,
                      lambda kind, reason, **data: events.append((kind, reason, data)))
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner._remember(TunerMemory(tuner.memory.fingerprint, **{
        "baseline_tps": 50.0, "baseline_key": tuner.memory.baseline_key, **memory}))
    return tuner, events


class Counters:
    """Cumulative llama.cpp counters for n-gram drafts of 16 at a given acceptance."""

    def __init__(self) -> None:
        self.drafts = self.draft_tokens = self.accepted = self.tokens = 0
        self.seconds = 0.0

    def step(self, acceptance: float, drafts: int = 10) -> MetricsSample:
        self.drafts += drafts
        self.draft_tokens += drafts * 16
        accepted = round(drafts * 16 * acceptance)
        self.accepted += accepted
        self.tokens += drafts * 4 + accepted  # steps without a draft as well
        self.seconds += (drafts * 4 + accepted) / 80.0  # 80 tokens/s: 1.6x the baseline
        per_pos = tuple(round(self.accepted / 16) for _ in range(16))
        return MetricsSample(process_start=1.0, drafts=self.drafts,
                             draft_tokens=self.draft_tokens, accepted_tokens=self.accepted,
                             accepted_per_position=per_pos, tokens_predicted=self.tokens,
                             tokens_predicted_seconds=self.seconds, requests_processing=1)


def run(tuner: AutoTuner, phases: list[tuple[float, int]]) -> None:
    counters = Counters()
    for acceptance, samples in phases:
        for _ in range(samples):
            tuner.observe(counters.step(acceptance))


def test_a_returning_workload_resumes_from_its_measurements_instead_of_searching(tmp_path):
    # Prose (0.3) already searched; then code (0.9), seen before with both variants measured.
    prose = {"mod": {"length": 16, "speedup": 1.05}, "simple": {"length": 48, "speedup": 1.0}}
    code = remember([], CODE, "mod", MEASURED, VARIANTS, now=1.0)
    tuner, events = make_tuner(tmp_path, {"variant": "mod", "length": 16, "variants": prose,
                                          "regimes": code})
    run(tuner, [(0.3, 12), (0.9, 14)])
    drift = [e for e in events if "drifted up" in e[1]]
    recalled = [e for e in events if e[2].get("action") == "recall"]
    assert drift and len(recalled) == 1
    assert recalled[0][2]["setting"] == "mod:16" and recalled[0][2]["variants"] == VARIANTS
    # Every variant is measured for this workload: mod stays, nothing to restart for.
    assert tuner._pending is None and tuner.variant == "mod"
    assert tuner.memory.variants["simple"] == VARIANTS["simple"]
    # The prose regime it left was kept beside code's.
    assert sorted(r["acceptance"]["mod:16"] for r in tuner.memory.regimes) == [0.3, 0.9]


def test_an_unknown_workload_searches_the_variants_again(tmp_path):
    prose = {"mod": {"length": 16, "speedup": 1.05}, "simple": {"length": 48, "speedup": 1.0}}
    tuner, events = make_tuner(tmp_path, {"variant": "mod", "length": 16, "variants": prose})
    run(tuner, [(0.3, 12), (0.9, 14)])
    assert not [e for e in events if e[2].get("action") == "recall"]
    assert tuner._pending is not None and tuner._pending.action == "variant"
    assert tuner._pending.memory.variant == "simple"


def test_the_proxy_books_the_exact_time_at_each_number_in_flight():
    async def scenario() -> dict[int, float]:
        book = ProxyRequests()

        async def request(delay: float, hold: float) -> None:
            await asyncio.sleep(delay)
            async with book.relaying():
                await asyncio.sleep(hold)

        assert book.take_busy() == {}
        await asyncio.gather(request(0.0, 0.3), request(0.1, 0.1))
        await asyncio.sleep(0.1)  # idle time is not busy
        return book.take_busy()

    busy = asyncio.run(scenario())
    assert set(busy) == {1, 2}
    assert busy[2] < busy[1] < 0.4 and 0.25 < busy[1] + busy[2] < 0.4


def test_sparse_requests_are_judged_on_the_proxy_clock_not_the_read_interval(tmp_path,
                                                                               monkeypatch):
    clock = [1000.0]

    class Time:
        time = staticmethod(lambda: clock[0])
        monotonic = staticmethod(lambda: clock[0])

    monkeypatch.setattr(autotuner, "time", Time)

    def busy_seconds(**proxy) -> float:
        tuner, _ = make_tuner(tmp_path, {})
        counters = Counters()
        # A request of 0.5 s between reads 2 s apart: the gauge saw it running at a read.
        for _ in range(6):
            clock[0] += 2.0
            tuner.observe(counters.step(0.9), **proxy)
        return tuner.by_load.stats()["1"].busy_seconds

    assert busy_seconds(proxy_peak=1, proxy_busy={1: 0.5}) == 5 * 0.5
    # Without the proxy's clock (requests straight to the runtime) every interval a
    # request was seen in is booked whole.
    assert busy_seconds() == 5 * 2.0
    # Requests the proxy did not see (the gauge shows more): the proxy's clock is not used.
    assert busy_seconds(proxy_peak=0, proxy_busy={1: 0.5}) == 5 * 2.0
