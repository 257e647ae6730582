"""The GGUF header reader: metadata and tensor infos, read forward once over mmap.

The parsing loop is our own, over the format and constants of the `gguf` package (value
types, quantisation block sizes): `gguf.GGUFReader` builds a numpy view per metadata
string, which takes ~20 s for a 262k-token vocabulary on these machines, too slow for a
check before every start. The tests check this reader against `GGUFReader` on files the
`gguf` writer made. What the metadata means is `supervisor.models.facts`' business.

Only the package's `constants` module is loaded (`FORMAT`): `import gguf` also imports its
reader, writer and quantisers, and numpy with them, which cost the daemon 12.5 MB of its
~74 MB and every command that reads a model ~0.15 s, for four tables of constants.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import mmap
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from supervisor.errors import SpecfleetError
from supervisor.models.identity import FileIdentity, file_identity


def _gguf_constants() -> ModuleType:
    """`gguf/constants.py` of the installed `gguf` package, without the package's
    `__init__` (which imports numpy); under a name of our own, so that a later `import
    gguf` (the tests' writer) still gets its own complete package."""
    name = "supervisor.models._gguf_constants"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("gguf")  # finds a top-level package, imports nothing
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed (pip install gguf)")
    path = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


FORMAT = _gguf_constants()
_T = FORMAT.GGUFValueType
_SCALAR = {
    _T.UINT8: "<B", _T.INT8: "<b", _T.UINT16: "<H", _T.INT16: "<h", _T.UINT32: "<I",
    _T.INT32: "<i", _T.FLOAT32: "<f", _T.BOOL: "<?", _T.UINT64: "<Q", _T.INT64: "<q",
    _T.FLOAT64: "<d",
}
# Arrays longer than this are summarised (count, digest), not kept: token lists,
# scores and merges are tens of MB as Python objects.
_KEEP_ARRAY = 64
TOKENS_KEY = "tokenizer.ggml.tokens"

Tensor = tuple[str, tuple[int, ...], int]  # name, shape, ggml type


@dataclass(frozen=True)
class Summary:
    """A long array: its length and (for strings) a digest."""

    count: int
    sha256: str


def read_header(path: Path) -> tuple[dict[str, Any], list[Tensor]]:
    """The metadata (long arrays summarised) and the tensor infos of a GGUF file."""
    with GGUFHeader(path) as header:
        meta = dict(header.metadata())
        return meta, header.tensors()


def truncation(path: Path) -> str | None:
    """Why a GGUF file is shorter than its own header says, or None when its tensors all
    end within it. A model still downloading or copied in part has a whole header (it comes
    first) and llama-server fails only once it reaches the missing data; refused before the
    start instead, it cannot cost a start, a crash loop or an eviction of others."""
    with GGUFHeader(path) as header:
        meta = dict(header.metadata())
        tensors = header.tensors()
        align = int(meta.get("general.alignment", 32) or 32)
        start = -(-header.pos // align) * align  # the data section, aligned after the infos
        ends = [off + tensor_bytes(shape, ttype)
                for (_, shape, ttype), off in zip(tensors, header.offsets, strict=True)]
        size = len(header.buf)
    need = start + max(ends, default=0)
    if size >= need:
        return None
    return (f"{path} is truncated: its tensors end at byte {need:,} but the file has "
            f"{size:,} bytes ({size * 100 // need}%): a download or copy that did not finish?")


def incomplete(files: Mapping[str, str]) -> str | None:
    """Why one of a target's model files (by role: model, draft) cannot be loaded whole: a
    GGUF file shorter than its header says. None when every GGUF file's tensors are all in
    it; a file whose header itself cannot be read is the runtime's (or the pairing guard's)
    to judge, as are files of other formats."""
    for role, name in files.items():
        path = Path(name)
        identity = file_identity(path)
        if identity is None or not path.is_file() or path.suffix.lower() != ".gguf":
            continue
        if (why := _truncation_of(identity)) is not None:
            return f"{role} file {why}"
    return None


@functools.lru_cache(maxsize=64)
def _truncation_of(identity: FileIdentity) -> str | None:
    """Per file identity (size and times in it): a file that grows is read again."""
    try:
        return truncation(Path(identity.path))
    except (SpecfleetError, OSError, ValueError, KeyError, TypeError):
        # Not a readable GGUF header, or a tensor type the installed gguf package does not
        # size: not what this check judges (the runtime will say what it thinks of it).
        return None


def read_tokens(path: Path) -> list[str]:
    """The token texts of a GGUF file in id order."""
    out: list[str] = []
    with GGUFHeader(path) as header:
        for key, value in header.metadata(want_tokens=True):
            if key == TOKENS_KEY:
                out = value
    return out


def tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    n = 1
    for d in shape:
        n *= d
    block, size = FORMAT.GGML_QUANT_SIZES[FORMAT.GGMLQuantizationType(ggml_type)]
    return n // block * size


class GGUFHeader:
    """A forward-only reader of the GGUF header (metadata and tensor infos) over mmap."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0

    def __enter__(self) -> GGUFHeader:
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise SpecfleetError(f"cannot read {self.path}: {exc}") from exc
        try:  # whatever is wrong with the file, it is closed again (a 4-byte file: truncated)
            try:
                self.buf = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:  # an empty file cannot be mapped
                raise SpecfleetError(f"cannot read {self.path}: {exc}") from exc
            if self.buf[:4] != b"GGUF":
                raise SpecfleetError(f"{self.path} is not a GGUF file (it does not start with "
                                     "'GGUF')")
            self.pos = 4
            self.version = self._u32()
            if self.version not in (2, 3):
                raise SpecfleetError(f"{self.path}: GGUF version {self.version} is not supported")
            self.n_tensors, self.n_kv = self._u64(), self._u64()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if hasattr(self, "buf"):
            self.buf.close()
        self._file.close()

    def _unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error as exc:
            raise SpecfleetError(f"{self.path}: the GGUF header is truncated") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def _u32(self) -> int:
        return int(self._unpack("<I"))

    def _u64(self) -> int:
        return int(self._unpack("<Q"))

    def _str_bytes(self) -> bytes:
        n = self._u64()
        if self.pos + n > len(self.buf):
            raise SpecfleetError(f"{self.path}: the GGUF header is truncated")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw

    def _str(self) -> str:
        return self._str_bytes().decode("utf-8", errors="replace")

    def _value(self, vtype: int, key: str, want_tokens: bool) -> Any:
        if vtype == _T.STRING:
            return self._str()
        if vtype == _T.ARRAY:
            return self._array(key, want_tokens)
        if vtype in _SCALAR:
            return self._unpack(_SCALAR[vtype])
        raise SpecfleetError(f"{self.path}: unknown GGUF value type {vtype} at key {key!r}")

    def _array(self, key: str, want_tokens: bool) -> Any:
        etype, count = self._u32(), self._u64()
        if etype == _T.STRING:
            if key == TOKENS_KEY and want_tokens:
                return [self._str() for _ in range(count)]
            digest = hashlib.sha256()
            for _ in range(count):
                digest.update(self._str_bytes() + b"\0")
            return Summary(count, digest.hexdigest())
        if etype in _SCALAR:
            size = struct.calcsize(_SCALAR[etype])
            if count <= _KEEP_ARRAY:
                values = list(struct.unpack_from(f"<{count}{_SCALAR[etype][1]}", self.buf, self.pos))
                self.pos += size * count
                return values
            self.pos += size * count
            return Summary(count, "")
        return [self._value(etype, key, want_tokens) for _ in range(count)]

    def metadata(self, want_tokens: bool = False) -> list[tuple[str, Any]]:
        out = []
        for _ in range(self.n_kv):
            key = self._str()
            out.append((key, self._value(self._u32(), key, want_tokens)))
        return out

    def tensors(self) -> list[Tensor]:
        """(name, shape, ggml type) of every tensor; call after metadata()."""
        out = []
        self.offsets: list[int] = []  # each tensor's data, from the data section's start
        for _ in range(self.n_tensors):
            name = self._str()
            n_dims = self._u32()
            shape = tuple(self._u64() for _ in range(n_dims))
            ttype = self._u32()
            self.offsets.append(self._u64())
            out.append((name, shape, ttype))
        return out
