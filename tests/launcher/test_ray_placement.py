"""Choosing a Ray node for a target, and what the Ray launcher checks on the node: pure
logic over plain values (the live tests on a real cluster are in test_ray_live.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError
from supervisor.launcher.ray.actor import file_problem
from supervisor.launcher.ray.placement import NodeView, choose, demand, nodes_from
from supervisor.launcher.ray.raylauncher import fingerprint, node_files, num_gpus
from supervisor.plugin.backend import LaunchSpec


def node(node_id: str, resource: str, gpus: float = 1, free_gpus: float = 1,
         alive: bool = True) -> NodeView:
    return NodeView(node_id=node_id, address="10.0.0.5", hostname="box", alive=alive,
                    total={"CPU": 2, "GPU": gpus, resource: 1, "node:10.0.0.5": 1},
                    available={"CPU": 2, "GPU": free_gpus, resource: 1})


A = node("aaaaaaaa11112222", "worker-a")
B = node("bbbbbbbb33334444", "worker-b")


def test_the_first_node_of_the_preference_list_that_fits_is_chosen() -> None:
    choice = choose([A, B], ("worker-b", "worker-a"), demand(1, 0, {}))
    assert not isinstance(choice, str)
    assert (choice.node, choice.name) == (B, "worker-b")


def test_a_dead_preferred_node_gives_way_to_the_next_one() -> None:
    dead_b = node("bbbbbbbb33334444", "worker-b", alive=False)
    choice = choose([A, dead_b], ("worker-b", "worker-a"), demand(1, 0, {}))
    assert not isinstance(choice, str) and choice.node == A


def test_a_node_that_just_lost_an_actor_is_passed_over_while_ray_decides() -> None:
    choice = choose([A, B], ("worker-a", "worker-b"), {}, suspect=frozenset({A.node_id}))
    assert not isinstance(choice, str) and choice.node == B
    # Pinned to it: no choice yet (the launcher waits for Ray), saying why.
    why = choose([A, B], ("worker-a",), {}, suspect=frozenset({A.node_id}))
    assert isinstance(why, str) and "lost an actor of ours moments ago" in why
    # Once Ray has marked it dead: gone, as for any dead node.
    dead_a = node("aaaaaaaa11112222", "worker-a", alive=False)
    gone = choose([dead_a, B], ("worker-a",), {}, suspect=frozenset({A.node_id}))
    assert gone == "no node fits: worker-a (10.0.0.5, node aaaaaaaa) is gone"


def test_no_node_fits_says_what_each_node_lacks() -> None:
    full_a = node("aaaaaaaa11112222", "worker-a", gpus=2, free_gpus=0)
    dead_b = node("bbbbbbbb33334444", "worker-b", alive=False)
    why = choose([full_a, dead_b], ("worker-a", "worker-b"), demand(1, 0, {}))
    assert why == ("no node fits: worker-a (10.0.0.5, node aaaaaaaa) has 0 of 2 GPU free, "
                   "1 needed; worker-b (10.0.0.5, node bbbbbbbb) is gone")


def test_a_name_no_node_has_is_reported_as_such() -> None:
    why = choose([A, B], ("worker-c",), {})
    assert isinstance(why, str) and why.startswith("no node of the Ray cluster matches")


def test_nodes_are_named_by_hostname_address_id_prefix_label_or_custom_resource() -> None:
    labelled = NodeView("cccccccc55556666", "10.0.0.7", "gpu-box", True, labels={"rack": "r1"})
    for name in ("gpu-box", "10.0.0.7", "cccccccc", "r1"):
        assert labelled.matches(name)
    assert not labelled.matches("cccc")  # a short prefix could be anyone's
    assert A.matches("worker-a") and not A.matches("node:10.0.0.5") and not A.matches("GPU")


def test_nodes_from_reads_ray_nodes_and_the_free_resources() -> None:
    table = [{"NodeID": "ab" * 14, "Alive": True, "NodeManagerAddress": "127.0.0.1",
              "NodeManagerHostname": "h", "Resources": {"GPU": 2.0}, "Labels": {"k": "v"}}]
    (view,) = nodes_from(table, {"ab" * 14: {"GPU": 1.0}})
    assert (view.address, view.total["GPU"], view.available["GPU"], view.labels) == (
        "127.0.0.1", 2.0, 1.0, {"k": "v"})


def test_a_dead_node_keeps_the_names_it_had_alive() -> None:
    """Ray lists a dead node with no resources: one named by a custom resource is still
    found by that name (and said to be gone), from what was seen while it was alive."""
    alive = {"NodeID": "cd" * 14, "Alive": True, "NodeManagerAddress": "10.0.0.7",
             "NodeManagerHostname": "h", "Resources": {"box-b": 1.0, "CPU": 4.0}}
    seen: dict[str, dict[str, float]] = {}
    nodes_from([alive], {}, seen)
    (dead,) = nodes_from([{**alive, "Alive": False, "Resources": {}}], {}, seen)
    assert dead.matches("box-b") and not dead.alive
    said = choose([dead], ("box-b",), {"CPU": 1.0})
    assert said == f"no node fits: box-b (10.0.0.7, node {'cd' * 4}) is gone"
    (unknown,) = nodes_from([{**alive, "Alive": False, "Resources": {}}], {})
    assert not unknown.matches("box-b")  # never seen alive: nothing to go by


def target(**over: object) -> Target:
    return Target.model_validate({"name": "t", "model": "/models/m.gguf", "port": 8080,
                                  "launcher": "ray", **over})


def test_gpus_listed_in_the_file_are_a_count_on_the_node() -> None:
    assert num_gpus(target(gpus=[0, 1])) == 2
    assert num_gpus(target()) == 0 and num_gpus(target(gpus="none")) == 0
    with pytest.raises(SpecfleetError, match="gpus: all"):
        num_gpus(target(gpus="all"))


def test_adoption_fingerprint_ignores_the_local_gpu_indices_but_not_the_command() -> None:
    spec = LaunchSpec(("llama-server", "--port", "8080"), {"CUDA_VISIBLE_DEVICES": "0"})
    same = LaunchSpec(("llama-server", "--port", "8080"), {"CUDA_VISIBLE_DEVICES": "1"})
    other = LaunchSpec(("llama-server", "--port", "8081"), {})
    t = target()
    assert fingerprint(spec, t) == fingerprint(same, t) != fingerprint(other, t)
    assert fingerprint(spec, t) != fingerprint(spec, target(ray={"nodes": ["worker-b"]}))


def test_only_absolute_model_paths_are_checked_on_the_node(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 12)
    files, sizes = node_files(target(model=str(model),
                                     speculation={"method": "draft", "draft": "/no/d.gguf"}))
    assert files == {"model": str(model), "draft": "/no/d.gguf"} and sizes == {"model": 16}
    assert node_files(target(model="Qwen/Qwen3-8B", backend="vllm")) == ({}, {})


def test_the_node_check_names_a_missing_file_a_wrong_magic_and_a_different_copy(
        tmp_path: Path) -> None:
    good, bad = tmp_path / "good.gguf", tmp_path / "bad.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 12)
    bad.write_bytes(b"<htm")
    assert file_problem("model", str(good), 16) is None
    assert file_problem("model", str(tmp_path / "x.gguf"), None) == (
        f"model file {tmp_path / 'x.gguf'} does not exist")
    assert "is not a GGUF file" in str(file_problem("model", str(bad), None))
    assert "has 16 bytes here and 17 on the daemon's machine" in str(
        file_problem("draft", str(good), 17))


def test_a_fleet_file_takes_ray_settings_and_placement() -> None:
    from supervisor.config.schema import Fleet
    fleet = Fleet.model_validate({
        "version": 1, "daemon": {"ray": {"address": "10.0.0.1:6379"}},
        "defaults": {"launcher": "ray", "ray": {"resources": {"vram": 8}}},
        "targets": {"a": {"model": "/m.gguf", "port": 8080, "ray": {"nodes": ["w1", "w2"]}}}})
    a = fleet.targets["a"]
    assert (a.launcher, a.ray.nodes, a.ray.resources) == ("ray", ("w1", "w2"), {"vram": 8.0})
    assert fleet.daemon.ray.namespace == "specfleet"


def test_check_warns_of_ray_settings_without_launcher_ray_and_refuses_all_gpus() -> None:
    from supervisor.plugin.registry import default_registry
    check = default_registry().check_target
    (warning,) = [p for p in check(target(launcher="process", ray={"nodes": ["w1"]}))
                  if p.path == ("ray",)]
    assert warning.severity == "warning" and "launcher: ray only" in warning.message
    (error,) = [p for p in check(target(gpus="all")) if p.path == ("gpus",)]
    assert error.severity == "error" and "no meaning on a Ray cluster" in error.message
    assert [p for p in check(target(gpus=[0])) if p.path in (("ray",), ("gpus",))] == []


def test_status_of_one_target_names_its_ray_node() -> None:
    from supervisor.cli.statusview import render_target
    status = {"name": "chat", "state": "ready", "placement": {
        "node": "worker-b (10.0.0.5, node bbbbbbbb)", "node_id": "b" * 56,
        "address": "10.0.0.5", "node_gpus": "0"}}
    text = render_target(status, None, now=0.0)
    assert "  node         worker-b (10.0.0.5, node bbbbbbbb), GPUs there: 0" in text
    assert "placement    GPU" not in text
