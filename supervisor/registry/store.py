"""The content-addressed cache of pulled layers: one directory per layer digest, shared by
every target and every daemon restart (docs/modelkit-formats.md).

A layer is streamed into a temporary file while its sha256 is computed; only a layer whose
digest and size are the ones the manifest gave is unpacked (a tar into a temporary
directory, with tarfile's "data" filter: no absolute paths, no `..`, no links out, no
devices; a raw layer as its one file) and renamed into `layers/<hex>/`. A tampered blob is
refused with both digests and leaves nothing behind. While a layer is unpacked its blob is
on disk too (twice its size for a moment). Manifests and configs are kept by digest, and the
last digest each tag resolved to, so that a target starts from the cache while its registry
is down. `prune` removes the layers used longest ago beyond a size limit, never those in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from supervisor.config.ociref import Reference
from supervisor.errors import SpecfleetError
from supervisor.registry.artifact import Layer

Progress = Callable[[int, int], None]  # (bytes so far, bytes in all)
USED = ".used"  # touched at each use: prune keeps the recently used


class TamperedBlob(SpecfleetError):
    pass


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


class LayerStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    # --- layers ---

    def _dir(self, digest: str) -> Path:
        return self.root / "layers" / _hex(digest)

    def place_of(self, layer: Layer) -> Path:
        """Where the layer's file (or directory) lies once it is unpacked: a path that names
        the digest, so a target's command is known before the pull."""
        base = self._dir(layer.digest)
        return base / layer.path if layer.archive == "tar" else base / Path(layer.path).name

    def path_of(self, layer: Layer) -> Path | None:
        """Where the layer's file (or directory) lies unpacked, if it is cached."""
        base, found = self._dir(layer.digest), self.place_of(layer)
        if not found.exists():
            return None
        with contextlib.suppress(OSError):
            (base / USED).touch()
        return found

    async def put(self, layer: Layer, chunks: AsyncIterator[bytes],
                  progress: Progress | None = None) -> Path:
        """Stream `layer` in from `chunks`, verified against its digest and size, unpacked
        into the cache; the path of its file. TamperedBlob when the bytes are not the ones
        the manifest named."""
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.root / "tmp", prefix="blob-")
        blob = Path(name)
        try:
            digest, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in chunks:
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    if progress is not None:
                        progress(size, layer.size)
            got = f"sha256:{digest.hexdigest()}"
            if got != layer.digest or size != layer.size:
                raise TamperedBlob(f"layer {layer.path!r} is not what the manifest names: its "
                                   f"bytes have digest {got} ({size} bytes), the manifest says "
                                   f"{layer.digest} ({layer.size} bytes); refused, nothing kept")
            # Off the event loop: extracting a model of gigabytes takes tens of seconds,
            # longer than the daemon's watchdog and every target's health checks can wait.
            await asyncio.to_thread(self._unpack, layer, blob)
        finally:
            blob.unlink(missing_ok=True)
        found = self.path_of(layer)
        if found is None:
            raise SpecfleetError(f"layer {layer.digest} holds no {layer.path!r} once unpacked")
        return found

    def _unpack(self, layer: Layer, blob: Path) -> None:
        work = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix="layer-"))
        try:
            opener = {"gzip": gzip.open, "zstd": _zstd_open}.get(layer.compression or "", open)
            if layer.archive == "tar":
                with opener(blob, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                    tar.extractall(work, filter="data")
            else:
                with opener(blob, "rb") as f, (work / Path(layer.path).name).open("wb") as out:
                    shutil.copyfileobj(f, out, 1 << 20)
            (work / USED).touch()
            target = self._dir(layer.digest)
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError, OSError):
                os.rename(work, target)  # another pull may have put it there first
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def prune(self, limit: int, keep: Iterable[str] = ()) -> list[str]:
        """Remove the layers used longest ago until the cache is within `limit` bytes; never
        one in `keep` (digests in use). The digests removed."""
        kept = {_hex(d) for d in keep}
        layers = []
        for d in (self.root / "layers").glob("*") if (self.root / "layers").exists() else []:
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            used = (d / USED).stat().st_mtime if (d / USED).exists() else 0.0
            layers.append((used, d, size))
        total = sum(size for _, _, size in layers)
        removed = []
        for _, d, size in sorted(layers, key=lambda x: x[0]):
            if total <= limit:
                break
            if d.name in kept:
                continue
            shutil.rmtree(d, ignore_errors=True)
            total -= size
            removed.append(f"sha256:{d.name}")
        return removed

    # --- manifests, configs and tags: small, kept for a start while the registry is down ---

    def put_json(self, digest: str, raw: bytes) -> None:
        if f"sha256:{hashlib.sha256(raw).hexdigest()}" != digest:
            raise TamperedBlob(f"manifest or config is not {digest}")
        path = self.root / "manifests" / _hex(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)

    def get_json(self, digest: str) -> bytes | None:
        path = self.root / "manifests" / _hex(digest)
        return path.read_bytes() if path.exists() else None

    def _tag_file(self, ref: Reference) -> Path:
        safe = ref.host.replace(":", "_").replace("[", "").replace("]", "")
        return self.root / "tags" / safe / ref.repository / (ref.tag or "latest")

    def remember_tag(self, ref: Reference, digest: str) -> None:
        path = self._tag_file(ref)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{digest} {time.time():.0f}\n")

    def last_digest(self, ref: Reference) -> str | None:
        """The digest the tag resolved to when it was last pulled (None: never)."""
        if ref.digest:
            return ref.digest
        try:
            return self._tag_file(ref).read_text().split()[0]
        except (OSError, IndexError):
            return None


@contextlib.contextmanager
def _zstd_open(path: Path, mode: str) -> Iterator[BinaryIO]:
    """A zstd-compressed blob read as a stream (CNCF ModelPack's `...tar+zstd` weights):
    the `zstandard` package's decompressor, which takes frames without a content size."""
    import zstandard

    with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        yield stream  # type: ignore[misc]
