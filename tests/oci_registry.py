"""A real OCI registry on loopback for the registry tests: Debian's `docker-registry`
(distribution 2.8, the reference implementation of the distribution API), with no auth and
its storage in the test's directory; and pushing a ModelKit in exactly the format KitOps
writes (docs/modelkit-formats.md §1: the Kitfile as JSON config with each entry's digest and
diffId, one tar layer per entry, names relative to the Kitfile, parent directories
included, times zero, uid 1000)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

BINARY = shutil.which("docker-registry")
KIT_LAYER = "application/vnd.kitops.modelkit.{kind}.v1.tar"


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def kit_tar(path: str, data: bytes) -> bytes:
    """A layer as Kit's writeLayerToTar makes it for one file at `path`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parts = path.split("/")
        for i in range(1, len(parts)):
            info = tarfile.TarInfo("/".join(parts[:i]))
            info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, 1000, 0, 0
            tar.addfile(info)
        info = tarfile.TarInfo(path)
        info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, 1000, 0, 0
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class LocalRegistry:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = directory / "config.yml"
        directory.mkdir(parents=True, exist_ok=True)
        config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                          f"    rootdirectory: {directory / 'data'}\n  delete:\n    enabled: true\n"
                          f"http:\n  addr: {self.host}\n")
        self.log = (directory / "registry.log").open("wb")
        self.proc = subprocess.Popen([str(BINARY), "serve", str(config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("docker-registry did not answer within 20 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob (distribution's filesystem driver layout)."""
        hexa = digest.split(":", 1)[1]
        return (self.directory / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
                / hexa[:2] / hexa / "data")

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = sha(data)
        start = urllib.request.Request(f"http://{self.host}/v2/{repo}/blobs/uploads/", b"",
                                       method="POST")
        with urllib.request.urlopen(start, timeout=30) as resp:
            location = resp.headers["Location"]
        sep = "&" if "?" in location else "?"
        put = urllib.request.Request(f"{location}{sep}digest={digest}", data, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(put, timeout=120).close()
        return digest

    def push_manifest(self, repo: str, tag: str, manifest: dict[str, Any]) -> str:
        raw = json.dumps(manifest).encode()
        req = urllib.request.Request(f"http://{self.host}/v2/{repo}/manifests/{tag}", raw,
                                     method="PUT", headers={
                                         "Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        urllib.request.urlopen(req, timeout=30).close()
        return sha(raw)

    def get_manifest(self, repo: str, tag: str) -> bytes:
        req = urllib.request.Request(f"http://{self.host}/v2/{repo}/manifests/{tag}", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()

    def push_modelpack(self, repo: str, tag: str, weights: list[tuple[str, bytes]],
                       name: str) -> str:
        """A CNCF ModelPack (model-spec docs/spec.md): one raw weight layer per file with its
        `org.cncf.model.filepath`, the ModelPack config (descriptor, config, modelfs with
        each layer's diffId, the digest of a raw layer); no Kitfile. Its digest."""
        layers, diff_ids = [], []
        for path, data in weights:
            digest = self.push_blob(repo, data)
            diff_ids.append(digest)
            layers.append({"mediaType": "application/vnd.cncf.model.weight.v1.raw",
                           "digest": digest, "size": len(data),
                           "annotations": {"org.cncf.model.filepath": path}})
        config = json.dumps({"descriptor": {"name": name},
                             "config": {"format": "gguf"},
                             "modelfs": {"type": "layers", "diffIds": diff_ids}}).encode()
        manifest = {"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "artifactType": "application/vnd.cncf.model.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                               "digest": self.push_blob(repo, config), "size": len(config)},
                    "layers": layers}
        return self.push_manifest(repo, tag, manifest)

    def push_modelkit(self, repo: str, tag: str, model: tuple[str, bytes],
                      parts: list[tuple[str, str, bytes]], package: dict[str, str]) -> str:
        """A ModelKit of a model (path, bytes) and parts (name, path, bytes); its digest."""
        kitfile: dict[str, Any] = {"manifestVersion": "1.0", "package": package,
                                   "model": {"name": package.get("name", "model"),
                                             "path": model[0], "parts": []}}
        layers = []
        for kind, entry, (path, data) in [("model", kitfile["model"], model)] + [
                ("modelpart", {"name": name}, (path, data)) for name, path, data in parts]:
            tar = kit_tar(path, data)
            digest = self.push_blob(repo, tar)
            entry.update(path=path, digest=digest, diffId=digest)  # uncompressed: the same
            if kind == "modelpart":
                kitfile["model"]["parts"].append(entry)
            layers.append({"mediaType": KIT_LAYER.format(kind=kind), "digest": digest,
                           "size": len(tar)})
        config = json.dumps(kitfile, separators=(",", ":")).encode()
        manifest = {"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "artifactType": "application/vnd.kitops.modelkit.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.kitops.modelkit.config.v1+json",
                               "digest": self.push_blob(repo, config), "size": len(config)},
                    "layers": layers,
                    "annotations": {"ml.kitops.modelkit.cli-version": "1.7.0"}}
        return self.push_manifest(repo, tag, manifest)


def cosign_sign(registry: LocalRegistry, repo: str, digest: str, private_key: Any,
                tamper: bool = False) -> str:
    """A signature of the manifest `digest` in cosign's layout (its `sha256-<hex>.sig` tag:
    a simple-signing payload layer with the base64 signature in its annotation), made with
    `private_key` (cryptography's EC P-256 or Ed25519); `tamper`: the payload changed after
    it was signed. The signature manifest's digest."""
    import base64

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    payload = json.dumps({"critical": {"identity": {"docker-reference": f"{registry.host}/{repo}"},
                                       "image": {"docker-manifest-digest": digest},
                                       "type": "cosign container image signature"},
                          "optional": None}, separators=(",", ":")).encode()
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        signature = private_key.sign(payload, ec.ECDSA(hashes.SHA256()))
    else:
        signature = private_key.sign(payload)
    if tamper:
        payload = payload.replace(b"cosign container", b"cosign c0ntainer")
    config = b"{}"
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": registry.push_blob(repo, config), "size": len(config)},
                "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                            "digest": registry.push_blob(repo, payload), "size": len(payload),
                            "annotations": {"dev.cosignproject.cosign/signature":
                                            base64.b64encode(signature).decode()}}]}
    return registry.push_manifest(repo, digest.replace(":", "-") + ".sig", manifest)


def public_pem(private_key: Any, path: Path) -> str:
    """The key's public half as cosign writes it (PEM, SubjectPublicKeyInfo); its path."""
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(path)


@pytest.fixture
def oci_registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    if BINARY is None:
        pytest.skip("no docker-registry: apt-get install docker-registry (scripts/system_packages.sh)")
    registry = LocalRegistry(tmp_path / "registry")
    try:
        yield registry
    finally:
        registry.stop()
