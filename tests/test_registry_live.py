"""The registry client and cache against a real registry on loopback (tests/oci_registry.py):
a ModelKit pushed in KitOps' format, resolved by tag, its layers pulled and verified; a
tampered blob, a moved tag, a registry that is down."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from supervisor.registry import artifact
from supervisor.registry.client import RegistryClient, RegistryError
from supervisor.registry.reference import parse
from supervisor.registry.store import LayerStore, TamperedBlob

TARGET, DRAFT = b"GGUF" + bytes(3000), b"GGUF" + b"d" * 1000


async def pull(ref_text: str, store: LayerStore) -> tuple[str, artifact.Artifact, dict]:
    ref = parse(ref_text)
    async with aiohttp.ClientSession() as session:
        client = RegistryClient(session, None, timeout=5)
        digest, raw = await client.manifest(ref)
        config_desc = json.loads(raw)["config"]
        config = b"".join([c async for c in client.blob(ref, config_desc["digest"])])
        kit = artifact.read(raw, config)
        paths = {}
        for layer in (kit.model(), kit.draft()):
            paths[layer.kind] = await store.put(layer, client.blob(ref, layer.digest))
        store.remember_tag(ref, digest)
        return digest, kit, paths


def test_a_modelkit_is_resolved_by_tag_and_its_model_and_draft_pulled_verified(
        tmp_path, oci_registry):
    pushed = oci_registry.push_modelkit("ns/pair", "v1", ("models/target.gguf", TARGET),
                                        [("draft", "models/draft.gguf", DRAFT)],
                                        {"name": "pair", "version": "1.0"})
    store = LayerStore(tmp_path / "cache")
    digest, kit, paths = asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", store))
    assert digest == pushed and kit.package == {"name": "pair", "version": "1.0"}
    assert paths["model"].read_bytes() == TARGET and paths["modelpart"].read_bytes() == DRAFT
    assert paths["model"].name == "target.gguf"


def test_a_tampered_blob_in_the_registry_is_refused(tmp_path, oci_registry):
    oci_registry.push_modelkit("ns/pair", "v1", ("target.gguf", TARGET),
                               [("draft", "draft.gguf", DRAFT)], {"name": "pair"})
    store = LayerStore(tmp_path / "cache")
    _, kit, _ = asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", store))
    # Someone with access to the registry's disk swaps the draft's bytes.
    blob = oci_registry.blob_file(kit.draft().digest)
    blob.write_bytes(blob.read_bytes().replace(b"d" * 10, b"e" * 10))
    with pytest.raises(TamperedBlob) as refused:
        asyncio.run(pull(f"{oci_registry.host}/ns/pair:v1", LayerStore(tmp_path / "fresh")))
    assert kit.draft().digest in str(refused.value) and "refused" in str(refused.value)


def test_a_moved_tag_resolves_to_its_new_digest_and_a_down_registry_is_a_clear_error(
        tmp_path, oci_registry):
    first = oci_registry.push_modelkit("ns/m", "latest", ("m.gguf", TARGET),
                                       [("draft", "d.gguf", DRAFT)], {"name": "m"})
    store = LayerStore(tmp_path / "cache")
    assert asyncio.run(pull(f"{oci_registry.host}/ns/m:latest", store))[0] == first
    moved = oci_registry.push_modelkit("ns/m", "latest", ("m.gguf", TARGET + b"v2"),
                                       [("draft", "d.gguf", DRAFT)], {"name": "m"})
    assert moved != first
    assert asyncio.run(pull(f"{oci_registry.host}/ns/m:latest", store))[0] == moved
    ref = parse(f"{oci_registry.host}/ns/m:latest")
    assert store.last_digest(ref) == moved
    oci_registry.stop()
    with pytest.raises(RegistryError, match="cannot be reached"):
        asyncio.run(pull(str(ref), store))
    assert store.last_digest(ref) == moved  # what a start while it is down falls back to
