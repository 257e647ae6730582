"""Which targets to unload so that another loads (gpu/swap.py), and the plan of a fleet
whose on-demand targets do not all fit (vram.plan_fleet): pure, plain numbers."""

from __future__ import annotations

import pytest

from supervisor.gpu import nvml as gpus
from supervisor.gpu import swap, vram
from supervisor.gpu.vram import GiB

ROOM = {0: 10 * GiB}


def loaded(name: str, gib: int, last_used: float, *, started: float = 0.0,
           evictable: bool = True, in_flight: int = 0, group: str | None = None,
           gpu: int = 0) -> swap.Loaded:
    return swap.Loaded(name, {gpu: gib * GiB}, evictable, started, last_used, in_flight,
                       min_residency=30.0, group=group)


def test_nothing_is_unloaded_when_the_target_fits_beside_the_others():
    choice = swap.choose({0: 4 * GiB}, ROOM, [loaded("a", 6, 100)], now=1000)
    assert choice == swap.Choice()


def test_the_least_recently_used_goes_first_and_only_as_many_as_needed():
    others = [loaded("old", 3, 100), loaded("recent", 3, 900), loaded("older", 3, 50)]
    choice = swap.choose({0: 4 * GiB}, ROOM, others, now=1000)
    assert choice.evict == ("older",) and "3.00 GiB short on GPU 0" in choice.why
    choice = swap.choose({0: 7 * GiB}, ROOM, others, now=1000)
    assert choice.evict == ("older", "old")


def test_a_target_with_a_request_in_flight_goes_after_the_idle_ones():
    others = [loaded("busy", 5, 10, in_flight=1), loaded("idle", 5, 900)]
    assert swap.choose({0: 5 * GiB}, ROOM, others, now=1000).evict == ("idle",)
    # When only the busy one frees enough, it goes (the loader drains it first).
    assert swap.choose({0: 5 * GiB}, ROOM, [loaded("busy", 5, 10, in_flight=1),
                                             loaded("pin", 5, 900, evictable=False)],
                       now=1000).evict == ("busy",)


def test_a_pinned_target_is_never_unloaded_and_says_why_the_load_is_impossible():
    choice = swap.choose({0: 6 * GiB}, ROOM, [loaded("pin", 5, 1, evictable=False)], now=1000)
    assert choice.evict == () and choice.wait_until is None
    assert choice.impossible == ("1.00 GiB short on GPU 0 even with every evictable target "
                                 "unloaded (held by pin, not evictable)")


def test_within_the_minimum_residency_the_load_waits_until_it_is_over():
    # "young" started at 990 with a 30 s residency: it may go at 1020, not before.
    choice = swap.choose({0: 6 * GiB}, ROOM, [loaded("young", 5, 995, started=990)], now=1000)
    assert choice.evict == () and choice.wait_until == 1020
    assert swap.choose({0: 6 * GiB}, ROOM, [loaded("young", 5, 995, started=990)],
                       now=1020).evict == ("young",)
    # One that may go now is preferred over a younger one used longer ago.
    others = [loaded("young", 5, 1, started=990), loaded("settled", 5, 999)]
    assert swap.choose({0: 5 * GiB}, ROOM, others, now=1000).evict == ("settled",)


def test_group_members_are_unloaded_whatever_the_memory():
    others = [loaded("chat-b", 1, 999, group="chat"), loaded("code", 1, 1)]
    choice = swap.choose({0: 1 * GiB}, ROOM, others, now=1000, group="chat")
    assert choice.evict == ("chat-b",) and choice.why == "group chat"
    # Without a GPU plan (no memory known) a group still swaps; nothing else does.
    assert swap.choose({}, {}, others, now=1000, group="chat").evict == ("chat-b",)
    assert swap.choose({}, {}, others, now=1000).evict == ()


def test_only_targets_on_the_short_gpu_are_unloaded():
    room = {0: 10 * GiB, 1: 10 * GiB}
    others = [loaded("on1", 8, 1, gpu=1), loaded("on0", 8, 500)]
    assert swap.choose({0: 4 * GiB}, room, others, now=1000).evict == ("on0",)


def demand(name: str, gib: int, swaps: bool = True) -> vram.Demand:
    return vram.Demand(name, vram.Estimate(weights=gib * GiB), None, swaps=swaps)


def test_a_fleet_that_fits_is_planned_as_before_even_with_on_demand_targets():
    plan = vram.plan_fleet([demand("a", 4), demand("b", 4)],
                           [vram.Device(0, "declared", 12 * GiB, 12 * GiB)], 0)
    assert plan.room is None and not plan.refused and set(plan.assignments) == {"a", "b"}


def test_on_demand_targets_that_do_not_all_fit_share_the_room_the_others_leave():
    devices = [vram.Device(0, "declared", 12 * GiB, 12 * GiB)]
    plan = vram.plan_fleet([demand("always", 4, swaps=False), demand("a", 5), demand("b", 5),
                            demand("c", 3), demand("huge", 9)], devices, 0)
    assert plan.room == {0: 8 * GiB}
    assert set(plan.assignments) == {"always", "a", "b", "c"}
    assert plan.assignments["a"].per_gpu == {0: 5 * GiB}
    assert plan.refused["huge"].endswith("even with no other on-demand target loaded")
    assert plan.at_once == ("a", "c")  # the most that run at once: two of the three
    # The targets that always run are planned, and refused, as before.
    plan = vram.plan_fleet([demand("x", 7, swaps=False), demand("y", 7, swaps=False),
                            demand("a", 6)], devices, 0)
    assert "y" in plan.refused and "a" in plan.refused


def test_the_most_that_fit_at_once_is_searched_not_taken_in_file_order():
    devices = [vram.Device(0, "declared", 10 * GiB, 10 * GiB)]
    plan = vram.plan_fleet([demand("big", 7), demand("s1", 3), demand("s2", 3),
                            demand("s3", 3)], devices, 0)
    assert plan.at_once == ("s1", "s2", "s3")


def test_check_shows_which_on_demand_targets_swap_and_refuses_one_that_never_fits(
        tmp_path, model, capsys):
    from supervisor.cli.main import main
    from tests.conftest import llama_target, write_fleet
    if gpus.read().gpus:
        pytest.skip("this machine has an NVIDIA GPU: the declared memory would not be used")
    targets = {n: llama_target(model, "/bin/true", start="on_demand") for n in ("a", "b", "c")}
    fleet = write_fleet(tmp_path, targets, gpu={"memory": ["2GiB"], "headroom": "0"})
    assert main(["check", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert "On-demand targets do not all fit at once: they share GPU 0 2.00 GiB" in out
    assert "the most that run at once: a, b" in out
    assert "swapped in on demand (evicting the least recently used): c" in out
    # Where even one alone cannot fit, the fleet is refused as before.
    fleet = write_fleet(tmp_path, targets, gpu={"memory": ["300MiB"], "headroom": "0"})
    assert main(["check", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert "targets.a: does not fit in GPU memory: needs" in err
    assert "even with no other on-demand target loaded" in err
    # Targets that always run keep today's behaviour: a fleet that does not fit is refused.
    always = {n: llama_target(model, "/bin/true") for n in ("a", "b", "c")}
    fleet = write_fleet(tmp_path, always, gpu={"memory": ["2GiB"], "headroom": "0"})
    assert main(["check", str(fleet)]) == 2
    assert "targets.c: does not fit in GPU memory" in capsys.readouterr().err


def test_fleet_file_errors_for_loading_keys_name_the_key(tmp_path, model):
    from supervisor.config.loader import load_fleet
    from supervisor.errors import FleetFileError
    from supervisor.plugin.registry import default_registry
    from tests.conftest import llama_target, write_fleet
    # The external launcher's own check (it says it cannot swap) comes through the registry.
    check = default_registry().check_target
    cases = [({"launcher": "external", "start": "on_demand"}, "targets.t.start",
              "an external server is not started or stopped by specfleet"),
             ({"group": "chat", "evictable": False}, "targets.t.evictable",
              "evictable: false contradicts that"),
             ({"idle_unload": "0s"}, "targets.t.idle_unload", "use a duration such as 10m"),
             ({"start": "lazy"}, "targets.t.start", "on_demand")]
    for over, path, message in cases:
        fleet = write_fleet(tmp_path, {"t": llama_target(model, "/bin/true", **over)})
        with pytest.raises(FleetFileError) as caught:
            load_fleet(fleet, check)
        text = "\n".join(caught.value.problems)
        assert path in text and message in text, text
