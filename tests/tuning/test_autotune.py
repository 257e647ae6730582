"""AutoTuner, the glue between one target's counters, its requests and its restarts, fed
plain samples: calibration first, decisions from the model, held for an idle server,
applied, persisted."""

from __future__ import annotations

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target
from supervisor.plugin.backend import MetricsSample, RuntimeInfo
from supervisor.tuning.autotuner import UNCLASSIFIED, AutoTuner
from supervisor.tuning.cost import StepCost
from supervisor.tuning.store import OFF, TuningStore

# A cheap draft: a drafted step costs 1.5 plain steps plus 0.1 a drafted token.
CHEAP = StepCost(plain=0.04, step=0.06, per_draft=0.004, per_accepted=0.0)
# A draft as dear as the target (a self-draft): speculation cannot pay.
DEAR = StepCost(plain=0.04, step=0.05, per_draft=0.04, per_accepted=0.0)


def make(tmp_path, method: str = "draft", start: int = 4,
         **tuning) -> tuple[AutoTuner, list[tuple[str, str, dict]]]:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    spec = {"method": method, "length": {"start": start, "min": 1, "max": 16}}
    if method == "draft":
        spec["draft"] = str(model)
    target = Target(name="t", model=str(model), port=1, speculation=spec,
                    tuning={"min_steps": 50, **tuning})
    events: list[tuple[str, str, dict]] = []
    tuner = AutoTuner(target, LlamaCppBackend(target), TuningStore(tmp_path / "tuning.json"),
                      lambda kind, reason, **data: events.append((kind, reason, data)))
    return tuner, events


class Counters:
    """Cumulative counters of a server drafting at length k with acceptance rho per position."""

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost
        self.n = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "tokens_predicted": 0}
        self.pos: list[int] = []
        self.seconds = 0.0

    def serve(self, k: int, rho: float, steps: int, busy: int = 1,
              start: float = 1.0) -> MetricsSample:
        if k == OFF:
            self.n["tokens_predicted"] += steps
            self.seconds += steps * self.cost.plain
        else:
            per_pos = [round(steps * rho ** (i + 1)) for i in range(k)]
            self.pos = [a + b for a, b in zip(self.pos + [0] * (k - len(self.pos)), per_pos,
                                              strict=False)] + self.pos[k:]
            accepted = sum(per_pos)
            self.n["drafts"] += steps
            self.n["draft_tokens"] += steps * k
            self.n["accepted_tokens"] += accepted
            self.n["tokens_predicted"] += steps + accepted
            self.seconds += steps * self.cost.drafted(k, accepted / steps)
        return MetricsSample(process_start=start, **self.n, accepted_per_position=tuple(self.pos),
                             tokens_predicted_seconds=self.seconds, requests_processing=busy)


def calibrate(tuner: AutoTuner, cost: StepCost) -> None:
    tuner.calibrated({"costs": {"1": cost.to_dict()}, "lengths": [2, 16], "intervals": 18})


def calibrated(tmp_path, **kwargs) -> tuple[AutoTuner, list[tuple[str, str, dict]], Counters]:
    """A tuner (`make`'s arguments) whose runtime started and whose calibration measured
    CHEAP, and the counters of a server that costs that."""
    tuner, events = make(tmp_path, **kwargs)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    calibrate(tuner, CHEAP)
    return tuner, events, Counters(CHEAP)


def test_no_decision_before_the_calibration_then_the_model_decides(tmp_path):
    tuner, events = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert tuner.needs_calibration
    c = Counters(CHEAP)
    for _ in range(10):
        assert tuner.observe(c.serve(4, 0.95, 200, busy=0)) is None
    assert tuner.view()["needs_calibration"] and tuner.last is None
    calibrate(tuner, CHEAP)
    assert not tuner.needs_calibration and events[-1][1].startswith("calibrated: a plain step 40")
    reason = tuner.observe(c.serve(4, 0.95, 200, busy=0))
    assert reason is not None and tuner.last is not None and tuner.last.setting > 4


def test_the_first_decision_is_said_even_when_it_keeps_the_setting(tmp_path):
    # A keep changes nothing, so only applied decisions are events; the first one says
    # that tuning has begun and on what prediction (a busy box's first minutes).
    tuner, events, c = calibrated(tmp_path, start=16)
    for _ in range(10):
        assert tuner.observe(c.serve(16, 0.95, 200, busy=1)) is None
    firsts = [(r, d) for kind, r, d in events if r.startswith("first decision")]
    assert len(firsts) == 1 and tuner.last is not None and tuner.last.setting == 16
    reason, data = firsts[0]
    assert "n=16 is predicted best" in reason and data["action"] == "keep"
    # Named `setting`, not old/new: an event with a new setting is a switch applied.
    assert data["setting"] == "n=16" and "new" not in data
    assert data["predicted"]["n=16"]["mid"] > 1


def test_once_the_plain_step_is_measured_a_losing_setting_is_turned_off_before_the_rest(
        tmp_path):
    tuner, events = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    plain = {"costs": {"1": StepCost(DEAR.plain, DEAR.plain, DEAR.plain / 2, 0).to_dict()},
             "lengths": [], "intervals": 6}
    tuner.plain_calibrated(plain)
    assert tuner.needs_calibration and "only decision is speculation off" in events[-1][1]
    c = Counters(DEAR)
    said = [r for _ in range(60) if (r := tuner.observe(c.serve(4, 0.98, 200, busy=0)))]
    assert len(said) == 1 and "below off" in said[0]
    # A setting that wins is kept until the drafted steps are measured too.
    (tmp_path / "b").mkdir()
    tuner, _ = make(tmp_path / "b")
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.plain_calibrated({**plain, "costs": {"1": StepCost(
        CHEAP.plain, CHEAP.plain, CHEAP.plain / 2, 0).to_dict()}})
    c = Counters(CHEAP)
    assert all(tuner.observe(c.serve(4, 0.95, 200, busy=0)) is None for _ in range(20))
    calibrate(tuner, CHEAP)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=0)) is not None  # now another length


def test_a_request_of_a_class_never_seen_is_served_first_at_the_shortest_length(tmp_path):
    tuner, _ = make(tmp_path, min_steps=200)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.plain_calibrated({"costs": {"1": StepCost(
        CHEAP.plain, CHEAP.plain, CHEAP.plain / 2, 0).to_dict()}, "lengths": [],
        "intervals": 6})
    c = Counters(CHEAP)
    for _ in range(3):
        tuner.observe(c.serve(4, 0.95, 200, busy=0), proxy_classes={"code": 380})
    assert tuner.arriving("poetry", 1) is None  # a drafted step's cost is not measured yet
    calibrate(tuner, CHEAP)  # (the plain step came first, as from a calibration beside)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=0), proxy_classes={"code": 380})
    tuner.apply_pending()
    tuner.restarted(2.0, beside=False)
    assert tuner.draft_length == 16  # code
    # 200 steps at n=16 of a text that accepts nothing cost 11 s more than at n=2; a
    # restart 2 s.
    reason = tuner.arriving("poetry", 1)
    assert reason is not None and "class 'poetry' never seen" in reason
    tuner.apply_pending()
    assert tuner.draft_length == 2 and tuner.memory.decisions[-1]["learning"] == "poetry"


def test_a_plain_step_that_comes_after_the_tuner_gave_up_waiting_holds_nothing(tmp_path):
    # The calibration took too long (it gives way to serving): the tuner decides from
    # serving; its plain step, when it comes, does not bring back the off-only wait.
    tuner, events = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.uncalibrated("the calibration beside the server has not measured a plain step")
    tuner.plain_calibrated({"costs": {"1": StepCost(
        CHEAP.plain, CHEAP.plain, CHEAP.plain / 2, 0).to_dict()}, "lengths": [],
        "intervals": 6})
    assert "decisions go on from serving" in events[-1][1]
    c = Counters(CHEAP)
    for _ in range(20):
        tuner.observe(c.serve(4, 0.95, 200, busy=0))
    # Every length weighed, as without a calibration; not only off and the running one.
    assert tuner.last is not None and "waiting for the calibration" not in tuner.last.reason
    assert {"off", "n=4", "n=8", "n=16"} <= set(tuner.last.data["predicted"])


def test_a_decision_waits_for_an_idle_server_then_is_applied_and_persisted(tmp_path):
    tuner, events, c = calibrated(tmp_path, max_wait=3600)
    for _ in range(5):
        assert tuner.observe(c.serve(4, 0.95, 200, busy=1)) is None  # pending, server busy
    assert tuner.view()["pending"] and "idle server" in tuner.view()["waiting_for"]
    reason = tuner.observe(c.serve(4, 0.95, 200, busy=0))
    assert reason is not None
    tuner.apply_pending()
    _, said, data = events[-1]
    assert data["old"] == "n=4" and data["new"] == f"n={tuner.draft_length}"
    assert data["predicted"][data["new"]]["mid"] > data["predicted"]["n=4"]["mid"]
    kept = TuningStore(tmp_path / "tuning.json").load("t", tuner.memory.fingerprint)
    assert kept.setting == tuner.draft_length and kept.decisions[-1]["reason"] == said
    assert kept.learnt["classes"][UNCLASSIFIED]["first"][1] > 0  # what was learnt is kept


def test_a_decision_is_applied_on_a_busy_server_when_the_restart_costs_no_service(tmp_path):
    tuner, _ = make(tmp_path, max_wait=3600)
    tuner.restart_is_free = True  # the new server starts beside the old one
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    calibrate(tuner, CHEAP)
    c = Counters(CHEAP)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=4)) is not None


def test_a_draft_as_dear_as_the_target_is_turned_off_and_stays_off(tmp_path):
    tuner, _ = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    calibrate(tuner, DEAR)
    c = Counters(DEAR)
    # At first the mix is young: losing 9 % of 2 minutes does not pay a 30 s restart.
    assert tuner.observe(c.serve(4, 0.98, 200, busy=0)) is None
    assert tuner.last is not None and "restart costs more" in tuner.last.reason
    reasons = [tuner.observe(c.serve(4, 0.98, 200, busy=0)) for _ in range(60)]
    said = [r for r in reasons if r]
    assert len(said) == 1 and "below off" in said[0]  # once it has lasted long enough
    tuner.apply_pending()
    assert not tuner.speculation_on
    for _ in range(20):  # served off: the same class, known to lose, stays off
        assert tuner.observe(c.serve(OFF, 0, 200, busy=0)) is None
    assert not tuner.speculation_on


def test_each_class_the_proxy_names_is_learnt_apart(tmp_path):
    tuner, _, c = calibrated(tmp_path)
    tuner.observe(c.serve(4, 0.9, 200), proxy_classes={"greedy /completion": 300})
    tuner.observe(c.serve(4, 0.3, 200), proxy_classes={"sampled /v1/chat/completions": 300})
    classes = tuner.view()["classes"]
    assert classes["greedy /completion"]["rho"] > 0.8 > 0.4 > \
        classes["sampled /v1/chat/completions"]["rho"]


def test_a_changed_model_or_runtime_drops_the_cost_and_calibrates_again(tmp_path):
    tuner, events = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    calibrate(tuner, CHEAP)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert not tuner.needs_calibration
    tuner.runtime_started(RuntimeInfo("/bin/true", "v2"))
    assert tuner.needs_calibration and tuner.memory.calibration is None
    assert events[-1][1].startswith("model file or runtime changed")


def test_a_plain_step_measured_for_other_files_allows_no_decision(tmp_path):
    tuner, _ = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.plain_calibrated({"costs": {"1": StepCost(
        DEAR.plain, DEAR.plain, DEAR.plain / 2, 0).to_dict()}, "lengths": [], "intervals": 6})
    tuner.runtime_started(RuntimeInfo("/bin/true", "v2"))  # another build: measure again
    c = Counters(DEAR)
    assert all(tuner.observe(c.serve(4, 0.98, 200, busy=0, start=2.0)) is None
               for _ in range(60))
    assert tuner.last is None


def test_a_daemon_restart_keeps_the_setting_the_calibration_and_what_was_learnt(tmp_path):
    tuner, _, c = calibrated(tmp_path)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=0)) is not None
    tuner.apply_pending()
    again, _ = make(tmp_path)
    assert again.draft_length == tuner.draft_length and not again.needs_calibration
    assert again.controller.classes[UNCLASSIFIED].steps > 0


def test_a_server_restart_does_not_look_like_negative_acceptance(tmp_path):
    tuner, _ = make(tmp_path)
    first = Counters(CHEAP)
    first.serve(4, 0.9, 100)
    tuner.observe(first.serve(4, 0.9, 100))
    tuner.observe(Counters(CHEAP).serve(4, 0.9, 10, start=2.0))  # counters restarted
    stats = tuner.window.stats()
    assert stats.drafts == 210


def test_a_started_ngram_mod_is_judged_only_once_it_has_served_min_tokens(tmp_path):
    # Its hash pool starts empty at each start (tests/backends/test_drafter_memory.py measures it).
    tuner, _ = make(tmp_path, method="ngram", min_tokens=300)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    c = Counters(CHEAP)
    tuner.observe(c.serve(8, 0.5, 100))
    assert tuner.view()["warming_tokens_left"] > 0 and not tuner.controller.classes
    for _ in range(3):
        tuner.observe(c.serve(8, 0.5, 100))
    assert tuner.view()["warming_tokens_left"] == 0 and tuner.controller.classes


def test_while_an_old_server_computes_on_the_same_cores_nothing_is_evidence(tmp_path):
    # steady_load run 4: a measurement while the old server still ran 8 requests on the
    # same 2 cores read a paying setting at 0.46x. While the old one finishes, nothing counts.
    tuner, _ = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    calibrate(tuner, CHEAP)
    tuner.share_cores(True)
    c = Counters(CHEAP)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=0)) is None
    assert not tuner.controller.classes and tuner.last is None


def test_the_prediction_a_decision_rested_on_is_checked_once_the_new_setting_has_served(
        tmp_path):
    tuner, events, c = calibrated(tmp_path)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=0)) is not None
    tuner.apply_pending()
    k = tuner.draft_length
    for _ in range(10):
        tuner.observe(c.serve(k, 0.95, 200, busy=2))
    checked = [data["check"] for _, reason, data in events if reason.startswith(
        "prediction checked")]
    assert len(checked) == 1 and checked[0]["setting"] == k
    # The served text is the one predicted: what was measured is what was expected.
    assert abs(checked[0]["measured"] / checked[0]["predicted"] - 1) < 0.05
