"""What a model file says about itself: shape, size, quantisation and tokenizer.

GGUF files are read from their header only. The parsing loop is our own, over the
format and constants of the `gguf` package (value types, quantisation block sizes):
`gguf.GGUFReader` builds a numpy view per metadata string, which takes ~20 s for a
262k-token vocabulary on these machines, too slow for a check before every start.
The tests check this reader against `GGUFReader` on files the `gguf` writer made.

Hugging Face model directories (vLLM targets) are read from config.json,
tokenizer.json / tokenizer_config.json and the safetensors headers.

Results are cached per file identity (path, size, mtime), so a restart costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf

from supervisor.errors import SpecfleetError

# Metadata keys of special tokens that generation depends on.
SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator")
# Architectures whose sliding-window pattern llama.cpp hard-codes when the GGUF does not
# carry `<arch>.attention.sliding_window_pattern` (src/models/*.cpp, b11434):
# (every n-th layer is full attention, whether the first layer is the full one).
SWA_PATTERNS = {"gemma2": (2, False), "gemma3": (6, False), "gemma-embedding": (6, False),
                "gemma3n": (5, False), "cohere2": (4, False), "llama4": (4, False),
                "olmo2": (4, False), "exaone4": (4, False), "openai-moe": (2, False),
                "gpt-oss": (2, False), "plamo3": (8, False), "smallthinker": (4, True)}

_SCALAR = {
    gguf.GGUFValueType.UINT8: "<B", gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H", gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I", gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f", gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q", gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}
# Arrays longer than this are summarised (count, digest), not kept: token lists,
# scores and merges are tens of MB as Python objects.
_KEEP_ARRAY = 64


@dataclass(frozen=True)
class Tokenizer:
    model: str  # llama.cpp's vocabulary type (llama, gpt2, ...) or the HF tokenizer's
    pre: str | None
    n_tokens: int
    tokens_sha256: str  # over the token texts in id order
    special: dict[str, int] = field(default_factory=dict)  # bos/eos/... -> id
    add_bos: bool | None = None
    add_eos: bool | None = None


@dataclass(frozen=True)
class ModelFacts:
    path: str
    format: str  # "gguf" | "hf"
    architecture: str
    parameters: int
    weight_bytes: int
    block_bits_per_weight: float | None  # bits per weight of the 2-D matrices in the blocks
    file_type: str | None
    embedding_length: int | None
    block_count: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    context_length: int | None
    feed_forward_length: int | None
    sliding_window: int | None
    swa_layers: int  # layers that use the sliding window (the rest keep the full context)
    n_vocab: int | None
    tokenizer: Tokenizer | None
    nextn_layers: int = 0  # MTP (next-n) layers carried by the file
    target_hidden_size: int | None = None  # EAGLE-3 heads: width of the model they serve
    target_layers: tuple[int, ...] = ()  # EAGLE-3 heads: target layers they read

    @property
    def is_eagle3(self) -> bool:
        return self.architecture == "eagle3"


def read(path: str | os.PathLike[str]) -> ModelFacts:
    """Facts about a GGUF file or a Hugging Face model directory (cached per file identity)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise SpecfleetError(f"cannot read {p}: {exc.strerror}") from exc
    if p.is_dir():
        return _read_hf_cached(str(p), _dir_identity(p))
    return _read_gguf_cached(str(p), st.st_size, st.st_mtime_ns)


def read_tokens(path: str | os.PathLike[str]) -> list[str]:
    """The token texts of a GGUF file or HF directory in id order (to show a difference)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return _hf_tokens(p)
    out: list[str] = []
    with _GGUFHeader(p) as header:
        for key, value in header.metadata(want_tokens=True):
            if key == "tokenizer.ggml.tokens":
                out = value
    return out


# --- GGUF ---

@lru_cache(maxsize=64)
def _read_gguf_cached(path: str, size: int, mtime_ns: int) -> ModelFacts:
    with _GGUFHeader(Path(path)) as header:
        meta = dict(header.metadata())
        tensors = header.tensors()
    return _facts_from_gguf(path, meta, tensors)


class _GGUFHeader:
    """A forward-only reader of the GGUF header (metadata and tensor infos) over mmap."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0

    def __enter__(self) -> _GGUFHeader:
        try:
            self._file = open(self.path, "rb")
            self.buf = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise SpecfleetError(f"cannot read {self.path}: {exc}") from exc
        if self.buf[:4] != b"GGUF":
            self.close()
            raise SpecfleetError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        self.pos = 4
        self.version = self._u32()
        if self.version not in (2, 3):
            self.close()
            raise SpecfleetError(f"{self.path}: GGUF version {self.version} is not supported")
        self.n_tensors, self.n_kv = self._u64(), self._u64()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
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

    def _value(self, vtype: int, key: str, want_tokens: bool) -> Any:
        if vtype == gguf.GGUFValueType.STRING:
            return self._str_bytes().decode("utf-8", errors="replace")
        if vtype == gguf.GGUFValueType.ARRAY:
            etype, count = self._u32(), self._u64()
            if etype == gguf.GGUFValueType.STRING:
                if key == "tokenizer.ggml.tokens" and want_tokens:
                    return [self._str_bytes().decode("utf-8", errors="replace")
                            for _ in range(count)]
                digest = hashlib.sha256()
                for _ in range(count):
                    digest.update(self._str_bytes() + b"\0")
                return _Summary(count, digest.hexdigest())
            if etype in _SCALAR:
                size = struct.calcsize(_SCALAR[etype])
                if count <= _KEEP_ARRAY:
                    values = list(struct.unpack_from(f"<{count}{_SCALAR[etype][1]}", self.buf,
                                                     self.pos))
                    self.pos += size * count
                    return values
                self.pos += size * count
                return _Summary(count, "")
            return [self._value(etype, key, want_tokens) for _ in range(count)]
        if vtype in _SCALAR:
            return self._unpack(_SCALAR[vtype])
        raise SpecfleetError(f"{self.path}: unknown GGUF value type {vtype} at key {key!r}")

    def metadata(self, want_tokens: bool = False) -> list[tuple[str, Any]]:
        out = []
        for _ in range(self.n_kv):
            key = self._str_bytes().decode("utf-8", errors="replace")
            out.append((key, self._value(self._u32(), key, want_tokens)))
        return out

    def tensors(self) -> list[tuple[str, tuple[int, ...], int]]:
        """(name, shape, ggml type) of every tensor; call after metadata()."""
        out = []
        for _ in range(self.n_tensors):
            name = self._str_bytes().decode("utf-8", errors="replace")
            n_dims = self._u32()
            shape = tuple(self._u64() for _ in range(n_dims))
            ttype = self._u32()
            self._u64()  # data offset
            out.append((name, shape, ttype))
        return out


@dataclass(frozen=True)
class _Summary:
    """A long array: its length and (for strings) a digest."""

    count: int
    sha256: str


def tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    n = 1
    for d in shape:
        n *= d
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    return n // block * size


def _facts_from_gguf(path: str, meta: dict[str, Any],
                     tensors: list[tuple[str, tuple[int, ...], int]]) -> ModelFacts:
    arch = str(meta.get("general.architecture", "unknown"))

    def key(name: str) -> Any:
        value = meta.get(f"{arch}.{name}")
        return value[0] if isinstance(value, list) and value and name != "target_layers" else value

    params = weight_bytes = block_params = block_bytes = 0
    nextn_tensors = False
    for name, shape, ttype in tensors:
        n = 1
        for d in shape:
            n *= d
        try:
            nbytes = tensor_bytes(shape, ttype)
        except (ValueError, KeyError) as exc:
            raise SpecfleetError(f"{path}: tensor {name} has an unknown type {ttype}") from exc
        params += n
        weight_bytes += nbytes
        if name.startswith("blk.") and len(shape) >= 2:
            block_params += n
            block_bytes += nbytes
        nextn_tensors |= ".nextn." in name

    tokens = meta.get("tokenizer.ggml.tokens")
    tokenizer = None
    if isinstance(tokens, _Summary):
        special = {s: int(meta[f"tokenizer.ggml.{s}_token_id"]) for s in SPECIAL_TOKENS
                   if f"tokenizer.ggml.{s}_token_id" in meta}
        tokenizer = Tokenizer(
            model=str(meta.get("tokenizer.ggml.model", "unknown")),
            pre=meta.get("tokenizer.ggml.pre"), n_tokens=tokens.count,
            tokens_sha256=tokens.sha256, special=special,
            add_bos=meta.get("tokenizer.ggml.add_bos_token"),
            add_eos=meta.get("tokenizer.ggml.add_eos_token"))

    block_count = _int(key("block_count"))
    head_count = _int(key("attention.head_count"))
    embedding = _int(key("embedding_length"))
    window = _int(key("attention.sliding_window"))
    swa_layers = 0
    if window and block_count:
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, list):  # one flag per layer
            swa_layers = sum(1 for flag in pattern if flag)
        else:
            n, dense_first = SWA_PATTERNS.get(arch, (int(pattern or 1), False))
            swa_layers = _swa_layer_count(block_count, n, dense_first)
    file_type = meta.get("general.file_type")
    try:
        ft_name = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") \
            if file_type is not None else None
    except ValueError:
        ft_name = str(file_type)
    return ModelFacts(
        path=path, format="gguf", architecture=arch, parameters=params,
        weight_bytes=weight_bytes,
        block_bits_per_weight=round(8 * block_bytes / block_params, 2) if block_params else None,
        file_type=ft_name, embedding_length=embedding, block_count=block_count,
        head_count=head_count, head_count_kv=_int(key("attention.head_count_kv")) or head_count,
        key_length=_int(key("attention.key_length")) or (
            embedding // head_count if embedding and head_count else None),
        value_length=_int(key("attention.value_length")) or (
            embedding // head_count if embedding and head_count else None),
        context_length=_int(key("context_length")),
        feed_forward_length=_int(key("feed_forward_length")),
        sliding_window=window, swa_layers=swa_layers,
        n_vocab=tokenizer.n_tokens if tokenizer else _int(key("vocab_size")),
        tokenizer=tokenizer,
        nextn_layers=_int(key("nextn_predict_layers")) or (1 if nextn_tensors else 0),
        target_hidden_size=_int(key("target_hidden_size")),
        target_layers=tuple(int(x) for x in (key("target_layers") or [])))


def _swa_layer_count(n_layers: int, n_pattern: int, dense_first: bool) -> int:
    """llama_hparams::set_swa_pattern: every n-th layer keeps the full context."""
    if n_pattern <= 1:
        return 0 if n_pattern == 1 else n_layers
    if dense_first:
        return sum(1 for il in range(n_layers) if il % n_pattern != 0)
    return sum(1 for il in range(n_layers) if il % n_pattern < n_pattern - 1)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# --- Hugging Face directories ---

def _dir_identity(p: Path) -> tuple[tuple[str, int, int], ...]:
    out = []
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        with_st = p / name
        if with_st.is_file():
            st = with_st.stat()
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


@lru_cache(maxsize=32)
def _read_hf_cached(path: str, identity: tuple[tuple[str, int, int], ...]) -> ModelFacts:
    p = Path(path)
    config = _json(p / "config.json")
    if config is None:
        raise SpecfleetError(f"{p} has no config.json: not a Hugging Face model directory")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    params = weight_bytes = block_params = block_bytes = 0
    for shard in sorted(p.glob("*.safetensors")):
        for name, info in _safetensors_header(shard).items():
            if name == "__metadata__":
                continue
            n = 1
            for d in info["shape"]:
                n *= d
            nbytes = info["data_offsets"][1] - info["data_offsets"][0]
            params += n
            weight_bytes += nbytes
            if ".layers." in name and len(info["shape"]) >= 2:
                block_params += n
                block_bytes += nbytes
    heads = text.get("num_attention_heads")
    hidden = text.get("hidden_size")
    head_dim = text.get("head_dim") or (hidden // heads if hidden and heads else None)
    tokenizer = _hf_tokenizer(p)
    arch = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
    return ModelFacts(
        path=path, format="hf", architecture=str(arch), parameters=params,
        weight_bytes=weight_bytes,
        block_bits_per_weight=round(8 * block_bytes / block_params, 2) if block_params else None,
        file_type=str(text.get("torch_dtype") or config.get("torch_dtype") or "") or None,
        embedding_length=hidden, block_count=text.get("num_hidden_layers"), head_count=heads,
        head_count_kv=text.get("num_key_value_heads") or heads, key_length=head_dim,
        value_length=head_dim, context_length=text.get("max_position_embeddings"),
        feed_forward_length=text.get("intermediate_size"),
        sliding_window=text.get("sliding_window"), swa_layers=0,
        n_vocab=text.get("vocab_size") or (tokenizer.n_tokens if tokenizer else None),
        tokenizer=tokenizer, nextn_layers=int(text.get("num_nextn_predict_layers") or 0),
        target_hidden_size=text.get("target_hidden_size"))


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecfleetError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else None


def _safetensors_header(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise SpecfleetError(f"cannot read the safetensors header of {path}: {exc}") from exc
    return header if isinstance(header, dict) else {}


def _hf_vocab(p: Path) -> tuple[str, dict[str, int], list[dict[str, Any]]] | None:
    data = _json(p / "tokenizer.json")
    if data is None:
        return None
    model = data.get("model") or {}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    return str(model.get("type", "unknown")), vocab, list(data.get("added_tokens") or [])


def _hf_tokens(p: Path) -> list[str]:
    parsed = _hf_vocab(p)
    if parsed is None:
        return []
    _, vocab, added = parsed
    by_id = {i: t for t, i in vocab.items()}
    by_id.update({int(a["id"]): str(a["content"]) for a in added})
    return [by_id.get(i, "") for i in range(max(by_id) + 1)] if by_id else []


def _hf_tokenizer(p: Path) -> Tokenizer | None:
    parsed = _hf_vocab(p)
    if parsed is None:
        return None
    kind, _, _ = parsed
    tokens = _hf_tokens(p)
    digest = hashlib.sha256()
    for t in tokens:
        digest.update(t.encode() + b"\0")
    ids = {t: i for i, t in enumerate(tokens)}
    special: dict[str, int] = {}
    config = _json(p / "tokenizer_config.json") or {}
    for name, hf_key in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"),
                         ("padding", "pad_token")):
        value = config.get(hf_key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value in ids:
            special[name] = ids[value]
    return Tokenizer(model=kind, pre=None, n_tokens=len(tokens), tokens_sha256=digest.hexdigest(),
                     special=special, add_bos=config.get("add_bos_token"),
                     add_eos=config.get("add_eos_token"))
