"""The registry client and cache against a real registry on loopback (tests/oci_registry.py):
a ModelKit pushed in KitOps' format, resolved by tag, its layers pulled and verified; a
tampered blob, a moved tag, a registry that is down."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from supervisor.config.ociref import parse
from supervisor.config.schema import Speculation, Target
from supervisor.registry.client import RegistryError
from supervisor.registry.modelkits import ModelKits, Resolved
from supervisor.registry.store import LayerStore, TamperedBlob

TARGET, DRAFT = b"GGUF" + bytes(3000), b"GGUF" + b"d" * 1000
DRAFTING = Target(name="t", port=1, modelkit="127.0.0.1:1/x:y",
                  speculation=Speculation(method="draft"))


async def pull(ref_text: str, store: LayerStore, target: Target = DRAFTING) -> tuple[
        Resolved, dict[str, Path]]:
    """Resolve and pull as the daemon does (registry/modelkits.py)."""
    async with aiohttp.ClientSession() as session:
        kits = ModelKits(store, session, timeout=5)
        resolved = await kits.resolve(ref_text)
        return resolved, await kits.pull(resolved, resolved.layers(target))


def test_a_modelkit_is_resolved_by_tag_and_its_model_and_draft_pulled_verified(
        tmp_path, oci_registry):
    pushed = oci_registry.push_modelkit("ns/pair", "v1", ("models/target.gguf", TARGET),
                                        [("draft", "models/draft.gguf", DRAFT)],
                                        {"name": "pair", "version": "1.0"})
    store = LayerStore(tmp_path / "cache")
    resolved, paths = asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", store))
    assert resolved.digest == pushed and resolved.artifact.package == {"name": "pair",
                                                                         "version": "1.0"}
    assert paths["model"].read_bytes() == TARGET and paths["draft"].read_bytes() == DRAFT
    assert paths["model"].name == "target.gguf"
    # Only what the target runs: without a draft method, the draft part stays in the registry.
    plain = DRAFTING.model_copy(update={"speculation": Speculation(method="ngram")})
    fresh = LayerStore(tmp_path / "plain")
    _, only = asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", fresh, plain))
    assert set(only) == {"model"} and fresh.path_of(resolved.artifact.draft()) is None


def test_a_tampered_blob_in_the_registry_is_refused(tmp_path, oci_registry):
    oci_registry.push_modelkit("ns/pair", "v1", ("target.gguf", TARGET),
                               [("draft", "draft.gguf", DRAFT)], {"name": "pair"})
    store = LayerStore(tmp_path / "cache")
    kit = asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", store))[0].artifact
    # Someone with access to the registry's disk swaps the draft's bytes.
    blob = oci_registry.blob_file(kit.draft().digest)
    blob.write_bytes(blob.read_bytes().replace(b"d" * 10, b"e" * 10))
    with pytest.raises(TamperedBlob) as refused:
        asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", LayerStore(tmp_path / "fresh")))
    assert kit.draft().digest in str(refused.value) and "refused" in str(refused.value)
    assert not list((tmp_path / "fresh" / "layers").glob(kit.draft().digest[7:] + "*"))


def test_a_moved_tag_resolves_to_its_new_digest_and_a_down_registry_falls_back_to_the_cache(
        tmp_path, oci_registry):
    first = oci_registry.push_modelkit("ns/m", "latest", ("m.gguf", TARGET),
                                       [("draft", "d.gguf", DRAFT)], {"name": "m"})
    store = LayerStore(tmp_path / "cache")
    assert asyncio.run(pull(f"{oci_registry.host}/ns/m:latest", store))[0].digest == first
    moved = oci_registry.push_modelkit("ns/m", "latest", ("m.gguf", TARGET + b"v2"),
                                       [("draft", "d.gguf", DRAFT)], {"name": "m"})
    assert moved != first
    resolved, paths = asyncio.run(pull(f"{oci_registry.host}/ns/m:latest", store))
    assert resolved.digest == moved and paths["model"].read_bytes() == TARGET + b"v2"
    ref = parse(f"{oci_registry.host}/ns/m:latest")
    assert store.last_digest(ref) == moved
    oci_registry.stop()
    # Down: the digest the tag last resolved to, from the cache, saying why.
    offline, cached = asyncio.run(pull(str(ref), store))
    assert offline.digest == moved and "cannot be reached" in offline.offline
    assert cached == paths
    # Down and never pulled here: a clear error naming both.
    with pytest.raises(RegistryError, match=r"cannot be reached.*never pulled here"):
        asyncio.run(pull(str(ref), LayerStore(tmp_path / "empty")))


def test_the_kitfile_a_modelkit_carries_reads_the_same_in_kitops_own_package(
        tmp_path, oci_registry):
    """Cross-check with KitOps' Python package: the config blob (the Kitfile as Kit writes
    it, JSON with each entry's digest) parsed by kitops' Kitfile names the model and the
    parts that specfleet takes for the target and the draft."""
    from kitops.modelkit.kitfile import Kitfile

    oci_registry.push_modelkit("ns/pair", "v1", ("models/target.gguf", TARGET),
                               [("draft", "models/draft.gguf", DRAFT)],
                               {"name": "pair", "version": "1.0"})
    resolved, _ = asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1",
                                   LayerStore(tmp_path / "cache")))
    config = oci_registry.get_manifest("ns/pair", "v1")
    blob = oci_registry.blob_file(json.loads(config)["config"]["digest"]).read_bytes()
    (tmp_path / "Kitfile").write_bytes(blob)
    kitfile = Kitfile(path=str(tmp_path / "Kitfile"))
    assert kitfile.model.path == resolved.artifact.model().path
    assert [p.path for p in kitfile.model.parts] == [resolved.artifact.draft().path]
    assert [p.name for p in kitfile.model.parts] == [resolved.artifact.draft().name]
    assert kitfile.package.name == resolved.artifact.package["name"]


def test_a_cncf_modelpack_is_pulled_the_same_way_its_weights_found_by_filepath(
        tmp_path, oci_registry):
    pushed = oci_registry.push_modelpack(
        "ns/pack", "v1", [("weights/draft.gguf", DRAFT), ("weights/target.gguf", TARGET)],
        "pack")
    resolved, paths = asyncio.run(pull(f"{oci_registry.host}/ns/pack:v1",
                                       LayerStore(tmp_path / "cache")))
    assert resolved.digest == pushed and resolved.artifact.format == "modelpack"
    # No Kitfile: the largest GGUF weight is the model, the only other one the draft.
    assert paths["model"].read_bytes() == TARGET and paths["draft"].read_bytes() == DRAFT
    assert paths["model"].name == "target.gguf" and resolved.artifact.package == {}
