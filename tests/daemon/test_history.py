"""A target's history for the status page (daemon/history.py): bounded by age and count, on
disk for the next daemon, marks only for what matters."""

from __future__ import annotations

import itertools
import json

from supervisor.daemon.history import History
from supervisor.events import Event


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_samples_and_marks_are_kept_read_back_by_the_next_daemon_and_aged_out(tmp_path):
    clock = Clock()
    h = History(tmp_path, keep=3600, clock=clock)
    h.sample("coder", {"tokens_per_second": 40.0, "acceptance_rate": 0.5, "other": 1})
    h.sample("coder", {"tokens_per_second": None})  # nothing to chart: not kept
    h.mark(Event("coder", "tuning", "length 8 -> 5", data={"action": "retune"},
                 time=clock.now + 1))
    h.mark(Event("coder", "state", "pid 42 started", "starting", "loading", time=clock.now + 2))
    h.mark(Event("coder", "state", "restart", "stopping", "starting", time=clock.now + 3))
    h.mark(Event("-", "reload", "reloaded"))
    view = h.view("coder")
    assert view["samples"] == [{"t": clock.now, "tokens_per_second": 40.0,
                                "acceptance_rate": 0.5, "mean_accepted_length": None,
                                "draft_length": None}]
    assert [(m["kind"], m.get("state")) for m in view["marks"]] == [("tuning", None),
                                                                   ("state", "starting")]
    assert view["marks"][0]["data"] == {"action": "retune"}

    clock.now += 1800
    again = History(tmp_path, keep=3600, clock=clock)  # a restarted daemon
    assert again.view("coder") == view
    assert again.view("coder", since=clock.now - 1800)["samples"] == []
    clock.now += 3600  # everything is older than keep now
    assert History(tmp_path, keep=3600, clock=clock).view("coder")["marks"] == []


def test_the_file_is_rewritten_from_memory_when_it_doubles_and_torn_lines_are_skipped(tmp_path):
    clock = Clock()
    h = History(tmp_path, max_points=10, clock=clock)
    for i in range(25):
        clock.now += 1
        h.sample("t", {"tokens_per_second": float(i)})
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) <= 20  # rewritten at twice max_points, appended since
    assert len(h.view("t")["samples"]) == 10 and h.view("t")["samples"][-1]["tokens_per_second"] == 24
    with (tmp_path / "t.jsonl").open("a") as f:
        f.write('{"t": 1000030, "s": {"tokens_per_sec')  # a crash mid-line
    reread = History(tmp_path, max_points=10, clock=clock).view("t")["samples"]
    assert [s["tokens_per_second"] for s in reread] == [float(i) for i in range(15, 25)]
    assert all(json.loads(line) for line in lines)


def test_compact_samples_keep_order_values_and_bounds_across_cutbacks():
    from supervisor.daemon.samples import COMPACT_AFTER, Samples

    s = Samples(("a", "n"), max_points=3 * COMPACT_AFTER, integral=frozenset({"n"}))
    for i in range(10 * COMPACT_AFTER):
        s.append(float(i), {"a": i / 2 if i % 3 else None, "n": i})
    assert len(s) == 3 * COMPACT_AFTER  # the oldest went as new ones came
    got = list(s)
    assert got[0][0] == 7 * COMPACT_AFTER and got[-2] == (10 * COMPACT_AFTER - 2.0, {
        "a": (10 * COMPACT_AFTER - 2) / 2, "n": 10 * COMPACT_AFTER - 2})
    assert all(t2 == t1 + 1 for (t1, _), (t2, _) in itertools.pairwise(got))
    assert got[2][1]["a"] is None and isinstance(got[0][1]["n"], int)
    s.drop_before(10 * COMPACT_AFTER - 5.0)
    assert [t for t, _ in s] == [10 * COMPACT_AFTER - k for k in (5.0, 4.0, 3.0, 2.0, 1.0)]


def test_a_rewrite_keeps_samples_and_marks_in_time_order(tmp_path):
    clock = Clock()
    h = History(tmp_path, max_points=4, max_marks=4, clock=clock)
    for i in range(12):
        clock.now += 1
        if i % 2:
            h.mark(Event("t", "tuning", f"decision {i}", time=clock.now))
        else:
            h.sample("t", {"draft_length": i, "tokens_per_second": 1.5 * i})
    times = [json.loads(line)["t"] for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert times == sorted(times)
    view = History(tmp_path, max_points=4, max_marks=4, clock=clock).view("t")
    assert [s["draft_length"] for s in view["samples"]] == [4, 6, 8, 10]
    assert [m["reason"] for m in view["marks"]] == [f"decision {i}" for i in (5, 7, 9, 11)]


def test_marks_have_a_bound_of_their_own_far_below_the_samples(tmp_path):
    """A target that swaps on demand makes thousands of marks an hour (the soak's daemon grew
    by them at ~440 bytes each): at most max_marks are kept, the newest."""
    clock = Clock()
    h = History(tmp_path, clock=clock)
    assert h.max_marks < h.max_points
    for i in range(h.max_marks + 50):
        clock.now += 1
        h.mark(Event("t", "state", f"evicted {i}", "ready", "unloaded", time=clock.now))
    marks = h.view("t")["marks"]
    assert len(marks) == h.max_marks
    assert marks[-1]["reason"] == f"evicted {h.max_marks + 49}"


def test_a_file_of_marks_is_rewritten_at_twice_the_marks_kept_not_twice_the_samples(tmp_path):
    """A swapping target makes ~1,200 marks an hour and few samples: counted with the samples,
    its file grew to 2 x max_points lines, every one parsed by the next daemon to keep the
    last max_marks."""
    clock = Clock()
    h = History(tmp_path, max_points=1000, max_marks=10, clock=clock)
    for i in range(5):
        clock.now += 1
        h.sample("t", {"tokens_per_second": float(i)})
    for i in range(95):
        clock.now += 1
        h.mark(Event("t", "state", f"evicted {i}", "ready", "unloaded", time=clock.now))
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len([p for p in lines if "m" in p]) <= 20  # rewritten at twice max_marks
    assert len([p for p in lines if "s" in p]) == 5  # the samples kept through each rewrite
    again = History(tmp_path, max_points=1000, max_marks=10, clock=clock).view("t")
    assert [m["reason"] for m in again["marks"]] == [f"evicted {i}" for i in range(85, 95)]
    assert len(again["samples"]) == 5
