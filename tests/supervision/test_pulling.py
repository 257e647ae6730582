"""A target whose model comes from a ModelKit, in-process (supervision/pulling.py): the
owner task of test_target_lifecycle.py for real with its fake runtime, the registry real
(tests/oci_registry.py) and the layers real and small. The pull comes before the first
start, the owner then runs the target at the pulled files, and what went wrong is said."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from supervisor.config.schema import Target
from supervisor.registry.modelkits import ModelKits
from supervisor.registry.store import LayerStore
from supervisor.supervision.commands import Command
from supervisor.supervision.states import State
from tests.lifecycle_doubles import START

S = State


def tiny_gguf(rows: int) -> bytes:
    """A GGUF that the pairing guard reads as it reads a real one (tokenizer, parameters)."""
    import tempfile

    import gguf
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/m.gguf"
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_tokenizer_model("llama")
        writer.add_token_list([f"t{i}" for i in range(16)])
        writer.add_tensor("token_embd.weight", np.zeros((rows, 16), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return Path(path).read_bytes()


MODEL, DRAFT = tiny_gguf(256), tiny_gguf(4)  # the draft a 64th of the target


@pytest.fixture
async def kits(tmp_path: Path) -> AsyncIterator[ModelKits]:
    async with aiohttp.ClientSession() as session:
        yield ModelKits(LayerStore(tmp_path / "cache"), session, timeout=5)


def push(registry, tag: str = "v1", model: bytes = MODEL) -> str:
    return registry.push_modelkit("lab/pair", tag, ("models/m.gguf", model),
                                  [("draft", "models/d.gguf", DRAFT)],
                                  {"name": "pair", "version": tag})


async def test_the_model_and_draft_are_pulled_before_the_first_start_and_the_target_runs_them(
        start_target, kits, oci_registry):
    digest = push(oci_registry)
    run = start_target(kits=kits, model="", modelkit=f"{oci_registry.host}/lab/pair:v1",
                       speculation={"method": "draft"})
    await run.reaches(S.READY)
    assert run.transitions == START  # pulled while starting: no process ran meanwhile
    target = run.sup.target
    assert Path(target.model).read_bytes() == MODEL
    assert Path(target.speculation.draft).read_bytes() == DRAFT
    assert run.sup.backend.target == target and run.sup.tuner.target == target
    kit = run.sup.status().modelkit
    assert kit["manifest_digest"] == digest and kit["package"] == {"name": "pair", "version": "v1"}
    assert set(kit["layers"]) == {"model", "draft"} and "pull" not in kit
    said = [e.reason for e in run.events if e.kind == "modelkit"]
    assert len(said) == 2 and digest in said[0] and "serving model" in said[1]
    # A restart of the same owner pulls nothing again.
    run.process.exit(-9)
    await run.reaches(S.READY, times=2)
    assert len([e for e in run.events if e.kind == "modelkit"]) == 2


async def test_a_tampered_layer_fails_the_start_for_good_saying_both_digests(
        start_target, kits, oci_registry):
    push(oci_registry)
    digest = json.loads(oci_registry.get_manifest("lab/pair", "v1"))["layers"][0]["digest"]  # model
    blob = oci_registry.blob_file(digest)
    data = blob.read_bytes()
    blob.write_bytes(data[:-2048] + b"x" * 32 + data[-2016:])  # inside the weights
    run = start_target(kits=kits, model="", modelkit=f"{oci_registry.host}/lab/pair:v1",
                       speculation={"method": "draft"})
    await run.reaches(S.FAILED)
    assert run.world.starts == []
    reason = run.events[-1].reason
    assert f"the manifest says {digest}" in reason and "bytes have digest sha256:" in reason
    assert run.sup.status().modelkit is None


async def test_a_registry_down_with_nothing_cached_waits_and_says_why(
        start_target, kits, oci_registry):
    ref = f"{oci_registry.host}/lab/pair:v1"
    oci_registry.stop()
    run = start_target(kits=kits, model="", modelkit=ref, speculation={"method": "draft"})
    await run.reaches(S.WAITING, times=3)  # tried again, and again: never given up
    assert run.world.starts == [] and S.FAILED not in {new for _, new in run.transitions}
    waiting = next(e for e in run.events if e.new == "waiting")
    assert "cannot be reached" in waiting.reason and "never pulled here" in waiting.reason
    assert waiting.data["failure"] == "unreachable"


async def test_an_artifact_without_the_draft_the_method_needs_fails_the_start(
        start_target, kits, oci_registry):
    oci_registry.push_modelkit("lab/solo", "v1", ("m.gguf", MODEL), [], {"name": "solo"})
    run = start_target(kits=kits, model="", modelkit=f"{oci_registry.host}/lab/solo:v1",
                       speculation={"method": "draft"})
    await run.reaches(S.FAILED)
    assert "no GGUF part to draft with" in run.events[-1].reason


async def test_a_pull_reports_its_progress_over_every_layer_it_fetches(kits, oci_registry):
    push(oci_registry)
    resolved = await kits.resolve(f"{oci_registry.host}/lab/pair:v1")
    target = Target(name="t", port=1, modelkit=str(resolved.ref),
                    speculation={"method": "draft"})
    layers = resolved.layers(target)
    seen: list[tuple[int, int]] = []
    await kits.pull(resolved, layers, lambda done, total: seen.append((done, total)))
    total = sum(x.size for x in layers.values())
    assert seen[-1] == (total, total) and all(t == total for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    seen.clear()
    await kits.pull(resolved, layers, lambda done, total: seen.append((done, total)))
    assert seen == []  # all cached: nothing fetched


@pytest.mark.parametrize(("command", "state"), [(Command.SHUTDOWN, S.STOPPED),
                                                (Command.UNLOAD, S.UNLOADED)])
async def test_a_shutdown_or_an_unload_during_a_pull_takes_effect_at_once(
        start_target, tmp_path, command, state):
    """A registry that takes the connection and never answers (a hung proxy, a host half
    down): the pull would wait out its 60-second timeout; a command ends it now."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            kits = ModelKits(LayerStore(tmp_path / "cache"), session, timeout=60)
            run = start_target(kits=kits, model="", modelkit=f"127.0.0.1:{port}/lab/pair:v1",
                               speculation={"method": "draft"})
            await run.until(lambda: bool(held))  # the manifest asked for, not answered
            run.sup.send(command, "removed from the fleet file")
            await run.reaches(state)  # within the scenario's 5 s, not the pull's 60
            assert run.transitions == [(S.STOPPED, S.STARTING), (S.STARTING, state)]
            assert run.world.starts == []
            assert run.events[-1].reason == ("removed from the fleet file (while the ModelKit "
                                             "was pulled)")
            assert run.sup.target.model == ""  # nothing pulled, nothing retargeted
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
