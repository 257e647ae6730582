"""Models from a registry, the parts without a registry (supervisor/registry/): references,
ModelKit and ModelPack manifests as KitOps and the ModelPack spec write them
(docs/modelkit-formats.md), the verified cache, credentials as docker keeps them."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile

import pytest

from supervisor.config import ociref as reference
from supervisor.registry import artifact, credentials
from supervisor.registry.store import LayerStore, TamperedBlob

D = "sha256:" + "a" * 64


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.mark.parametrize(("text", "parts"), [
    ("registry.example.com/ns/model:v1", ("registry.example.com", "ns/model", "v1", None)),
    ("127.0.0.1:5000/m", ("127.0.0.1:5000", "m", None, None)),
    (f"localhost/a/b:t@{D}", ("localhost", "a/b", "t", D)),
    ("[::1]:5000/x:y", ("[::1]:5000", "x", "y", None)),
])
def test_references_name_host_repository_tag_and_digest(text, parts):
    ref = reference.parse(text)
    assert (ref.host, ref.repository, ref.tag, ref.digest) == parts
    assert str(ref) == text


@pytest.mark.parametrize(("text", "said"), [
    ("ns/model:v1", "names no registry host"), ("model", "names no registry host"),
    ("reg.io/Upper:v1", "repository 'Upper' is not valid"),
    ("reg.io/a:-bad", "tag '-bad' is not valid"),
    ("reg.io/a@sha256:abc", "digest 'sha256:abc' is not valid"),
    ("reg.io/a@", "digest '' is not valid"),
])
def test_a_bad_reference_says_what_is_wrong_and_what_is_valid(text, said):
    with pytest.raises(reference.ReferenceError, match=said):
        reference.parse(text)


def test_loopback_registries_are_plain_http_others_https():
    assert reference.parse("127.0.0.1:5000/m:v").base_url == "http://127.0.0.1:5000/v2/m"
    assert reference.parse("reg.example.com/m:v").base_url == "https://reg.example.com/v2/m"
    assert reference.parse("reg.io/m:v").pinned(D).version == D


def kit_manifest(layers, config=None, artifact_type=True):
    manifest = {"schemaVersion": 2, "config": {"mediaType": artifact.KIT_CONFIG,
                                               "digest": D, "size": 10},
                "layers": layers}
    if artifact_type:
        manifest.update(mediaType=artifact.OCI_MANIFEST, artifactType=artifact.KIT_MANIFEST)
    return json.dumps(manifest).encode()


def desc(kind, digest, size=10, compression=""):
    return {"mediaType": f"application/vnd.kitops.modelkit.{kind}.v1.tar{compression}",
            "digest": digest, "size": size}


KITFILE = {"manifestVersion": "1.0", "package": {"name": "gemma-pair", "version": "1.2"},
           "model": {"name": "target", "path": "models/target.gguf",
                     "parts": [{"name": "draft", "path": "models/draft.gguf"},
                               {"name": "tokenizer", "path": "models/tok.json"}]},
           "docs": [{"path": "README.md"}]}


def test_a_modelkit_maps_layers_to_kitfile_entries_by_order_within_each_kind():
    layers = [desc("model", "sha256:" + "1" * 64, 100), desc("modelpart", "sha256:" + "2" * 64),
              desc("modelpart", "sha256:" + "3" * 64), desc("docs", "sha256:" + "4" * 64, 5,
                                                            "+gzip")]
    for with_type in (True, False):  # older Kit writes no artifactType: the config tells
        kit = artifact.read(kit_manifest(layers, artifact_type=with_type),
                            json.dumps(KITFILE).encode())
        assert kit.format == "kit" and kit.package == {"name": "gemma-pair", "version": "1.2"}
        assert kit.model().path == "models/target.gguf" and kit.model().size == 100
        assert kit.draft().name == "draft" and kit.draft("draft.gguf").path == "models/draft.gguf"
        assert kit.layers[3].compression == "gzip"
    with pytest.raises(artifact.ArtifactError, match="no GGUF part called 'nope'"):
        kit.draft("nope")


def test_two_gguf_parts_need_a_name_and_a_digest_the_kitfile_contradicts_is_refused():
    two = {**KITFILE, "model": {**KITFILE["model"], "parts": [
        {"name": "a", "path": "a.gguf"}, {"name": "b", "path": "b.gguf"}]}}
    layers = [desc("model", "sha256:" + "1" * 64), desc("modelpart", "sha256:" + "2" * 64),
              desc("modelpart", "sha256:" + "3" * 64)]
    kit = artifact.read(kit_manifest(layers), json.dumps(two).encode())
    with pytest.raises(artifact.ArtifactError, match=r"2 GGUF parts \(a, b\): name the draft"):
        kit.draft()
    assert kit.draft("b").digest == "sha256:" + "3" * 64
    wrong = {**KITFILE, "model": {**KITFILE["model"], "digest": "sha256:" + "9" * 64}}
    with pytest.raises(artifact.ArtifactError, match="has digest sha256:9"):
        artifact.read(kit_manifest(layers), json.dumps(wrong).encode())


def test_a_modelpack_finds_its_weights_by_filepath_and_refuses_an_image_or_an_index():
    def weight(digest, path, size):
        return {"mediaType": "application/vnd.cncf.model.weight.v1.raw", "digest": digest,
                "size": size, "annotations": {artifact.FILEPATH_ANNOTATION: path}}
    pack = {"mediaType": artifact.OCI_MANIFEST, "artifactType": artifact.MODELPACK_MANIFEST,
            "config": {"mediaType": artifact.MODELPACK_CONFIG, "digest": D, "size": 1},
            "layers": [weight("sha256:" + "1" * 64, "small.gguf", 10),
                       weight("sha256:" + "2" * 64, "big.gguf", 1000)]}
    found = artifact.read(json.dumps(pack).encode(), None)
    assert found.format == "modelpack" and found.model().path == "big.gguf"
    assert found.draft().path == "small.gguf" and found.layers[0].archive == "raw"
    image = {"mediaType": artifact.OCI_MANIFEST, "config": {
        "mediaType": "application/vnd.oci.image.config.v1+json", "digest": D, "size": 1},
        "layers": []}
    with pytest.raises(artifact.ArtifactError, match="not a ModelKit or a ModelPack"):
        artifact.read(json.dumps(image).encode(), None)
    with pytest.raises(artifact.ArtifactError, match="index of several manifests"):
        artifact.read(json.dumps({"mediaType": artifact.OCI_INDEX, "manifests": []}).encode(),
                      None)


def tar_of(files: dict[str, bytes | None], compress: bool = False) -> bytes:
    """A tar as Kit writes one: the entry's parent directories too (None: a directory)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue()) if compress else raw.getvalue()


async def chunks(data: bytes, size: int = 7):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def layer_for(blob: bytes, path: str, compression=None, archive="tar") -> artifact.Layer:
    return artifact.Layer(sha(blob), len(blob), "m", "model", archive, compression, path)


def test_a_layer_is_verified_while_streaming_unpacked_and_found_again(tmp_path):
    store = LayerStore(tmp_path)
    blob = tar_of({"models": None, "models/target.gguf": b"GGUF-weights"}, compress=True)
    layer = layer_for(blob, "models/target.gguf", "gzip")
    seen = []
    path = asyncio.run(store.put(layer, chunks(blob), lambda n, total: seen.append((n, total))))
    assert path.read_bytes() == b"GGUF-weights" and seen[-1] == (len(blob), len(blob))
    assert store.path_of(layer) == path
    raw = layer_for(b"RAW", "dir/x.gguf", archive="raw")
    assert asyncio.run(store.put(raw, chunks(b"RAW"))).read_bytes() == b"RAW"
    assert list((tmp_path / "tmp").iterdir()) == []  # no blob left behind


def test_zstd_layers_of_either_archive_are_streamed_out_as_a_modelpack_names_them(tmp_path):
    # CNCF ModelPack's weight.v1.tar+zstd and .raw+zstd, compressed as a streaming writer
    # does (frames without a content size), by the zstandard package itself.
    import zstandard

    def zstd(data: bytes) -> bytes:
        out = io.BytesIO()
        with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as writer:
            writer.write(data)
        return out.getvalue()

    weights = os.urandom(3000) * 50  # larger than one read, compressible
    tarred = zstd(tar_of({"models": None, "models/w.gguf": weights}))
    raw = zstd(weights)
    for media, blob, path in (("application/vnd.cncf.model.weight.v1.tar+zstd", tarred,
                               "models/w.gguf"),
                              ("application/vnd.cncf.model.weight.v1.raw+zstd", raw, "w.gguf")):
        pack = {"mediaType": artifact.OCI_MANIFEST, "artifactType": artifact.MODELPACK_MANIFEST,
                "config": {"mediaType": artifact.MODELPACK_CONFIG, "digest": D, "size": 1},
                "layers": [{"mediaType": media, "digest": sha(blob), "size": len(blob),
                            "annotations": {artifact.FILEPATH_ANNOTATION: path}}]}
        layer = artifact.read(json.dumps(pack).encode(), None).model()
        assert layer.compression == "zstd" and layer.archive in media
        store = LayerStore(tmp_path / layer.archive)
        assert asyncio.run(store.put(layer, chunks(blob, 4096))).read_bytes() == weights


def test_a_tampered_blob_is_refused_with_both_digests_and_leaves_nothing(tmp_path):
    store = LayerStore(tmp_path)
    good = tar_of({"m.gguf": b"good"})
    layer = layer_for(good, "m.gguf")
    bad = tar_of({"m.gguf": b"evil"})
    with pytest.raises(TamperedBlob) as refused:
        asyncio.run(store.put(layer, chunks(bad)))
    assert sha(bad) in str(refused.value) and layer.digest in str(refused.value)
    assert store.path_of(layer) is None and list((tmp_path / "tmp").iterdir()) == []


def test_a_tar_that_escapes_its_directory_is_refused(tmp_path):
    evil = tar_of({"../../outside.gguf": b"x"})
    with pytest.raises(tarfile.TarError):
        asyncio.run(LayerStore(tmp_path / "c").put(layer_for(evil, "outside.gguf"), chunks(evil)))
    assert not (tmp_path / "outside.gguf").exists()


def test_prune_removes_the_least_recently_used_beyond_the_limit_but_never_one_in_use(tmp_path):
    store = LayerStore(tmp_path)
    layers = []
    for i in range(3):
        blob = tar_of({f"m{i}.gguf": bytes(1000)})
        layers.append(layer_for(blob, f"m{i}.gguf"))
        asyncio.run(store.put(layers[-1], chunks(blob, 4096)))
        os.utime(tmp_path / "layers" / layers[-1].digest[7:] / ".used", (i, i))
    removed = store.prune(2000, keep=[layers[0].digest])
    assert removed == [layers[1].digest]
    assert store.path_of(layers[0]) and store.path_of(layers[2]) and not store.path_of(layers[1])


def test_a_tag_remembers_its_last_digest_for_a_start_while_the_registry_is_down(tmp_path):
    store = LayerStore(tmp_path)
    ref = reference.parse("127.0.0.1:5000/ns/m:v1")
    assert store.last_digest(ref) is None
    raw = b'{"schemaVersion": 2}'
    store.put_json(sha(raw), raw)
    store.remember_tag(ref, sha(raw))
    assert store.last_digest(ref) == sha(raw) and store.get_json(sha(raw)) == raw
    with pytest.raises(TamperedBlob):
        store.put_json(D, raw)


def test_credentials_come_from_docker_config_a_helper_or_nowhere(tmp_path, monkeypatch):
    auth = base64.b64encode(b"alice:s3cret").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"reg.example.com": {
        "auth": auth}}, "credHelpers": {"helped.example.com": "fake"}}))
    helper = tmp_path / "bin" / "docker-credential-fake"
    helper.parent.mkdir()
    helper.write_text('#!/bin/sh\nread host\necho "{\\"Username\\": \\"bob\\", '
                      '\\"Secret\\": \\"for-$host\\"}"\n')
    helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
    env = {"DOCKER_CONFIG": str(tmp_path), "PATH": f"{helper.parent}:{os.environ['PATH']}"}
    monkeypatch.setenv("PATH", env["PATH"])  # the helper is found on PATH, as docker finds it
    found = credentials.lookup("reg.example.com", env)
    helped = credentials.lookup("helped.example.com", env)
    assert (found.username, found.secret) == ("alice", "s3cret") and "s3cret" not in repr(found)
    assert (helped.username, helped.secret) == ("bob", "for-helped.example.com")
    assert credentials.lookup("other.example.com", env) is None
    ci = {"DOCKER_AUTH_CONFIG": json.dumps({"auths": {"ci.example.com": {
        "username": "u", "password": "p"}}}), "DOCKER_CONFIG": str(tmp_path / "none")}
    assert credentials.lookup("ci.example.com", ci).secret == "p"
