"""What a model file says about itself: shape, size, quantisation and tokenizer.

GGUF files are read from their header only (`supervisor.models.gguf`), Hugging Face
model directories (vLLM targets) from config.json, the tokenizer files and the
safetensors headers (`supervisor.models.hf`). This module turns either into one
`ModelFacts`. Results are cached per file identity (`supervisor.models.identity`:
resolved path, device, inode, size, mtime and ctime; for a directory, every file under
it), so a restart costs nothing and a file replaced in place is read again.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from supervisor.errors import SpecfleetError
from supervisor.models import hf
from supervisor.models.gguf import FORMAT, TOKENS_KEY, Summary, Tensor, read_header, tensor_bytes
from supervisor.models.gguf import read_tokens as read_gguf_tokens
from supervisor.models.identity import FileIdentity, file_identity

__all__ = ["SPECIAL_TOKENS", "SWA_PATTERNS", "ModelFacts", "Tokenizer", "read", "read_tokens",
           "tensor_bytes"]

# Metadata keys of special tokens that generation depends on.
SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator")
# Architectures whose sliding-window pattern llama.cpp hard-codes when the GGUF does not
# carry `<arch>.attention.sliding_window_pattern` (src/models/*.cpp, b11434):
# (every n-th layer is full attention, whether the first layer is the full one).
SWA_PATTERNS = {"gemma2": (2, False), "gemma3": (6, False), "gemma-embedding": (6, False),
                "gemma3n": (5, False), "cohere2": (4, False), "llama4": (4, False),
                "olmo2": (4, False), "exaone4": (4, False), "openai-moe": (2, False),
                "gpt-oss": (2, False), "plamo3": (8, False), "smallthinker": (4, True)}


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
    identity = file_identity(p)
    if identity is None:
        try:
            p.stat()
        except OSError as exc:
            raise SpecfleetError(f"cannot read {p}: {exc.strerror}") from exc
        raise SpecfleetError(f"cannot read {p}")
    if p.is_dir():
        return _read_hf_cached(str(p), identity)
    return _read_gguf_cached(str(p), identity)


def read_tokens(path: str | os.PathLike[str]) -> list[str]:
    """The token texts of a GGUF file or HF directory in id order (to show a difference)."""
    p = Path(path).expanduser()
    return hf.tokens(p) if p.is_dir() else read_gguf_tokens(p)


# --- GGUF ---

@lru_cache(maxsize=64)
def _read_gguf_cached(path: str, identity: FileIdentity) -> ModelFacts:  # identity: the cache key
    meta, tensors = read_header(Path(path))
    return _facts_from_gguf(path, meta, tensors)


def _gguf_weights(path: str, tensors: list[Tensor]) -> hf.Weights:
    params = nbytes_total = block_params = block_bytes = 0
    for name, shape, ttype in tensors:
        n = math.prod(shape)
        try:
            nbytes = tensor_bytes(shape, ttype)
        except (ValueError, KeyError) as exc:
            raise SpecfleetError(f"{path}: tensor {name} has an unknown type {ttype}") from exc
        params += n
        nbytes_total += nbytes
        if name.startswith("blk.") and len(shape) >= 2:  # 2-D tensors of the transformer blocks
            block_params += n
            block_bytes += nbytes
    return hf.Weights(params, nbytes_total, block_params, block_bytes)


def _gguf_tokenizer(meta: dict[str, Any]) -> Tokenizer | None:
    tokens = meta.get(TOKENS_KEY)
    if not isinstance(tokens, Summary):
        return None
    special = {s: int(meta[f"tokenizer.ggml.{s}_token_id"]) for s in SPECIAL_TOKENS
               if f"tokenizer.ggml.{s}_token_id" in meta}
    return Tokenizer(
        model=str(meta.get("tokenizer.ggml.model", "unknown")),
        pre=meta.get("tokenizer.ggml.pre"), n_tokens=tokens.count,
        tokens_sha256=tokens.sha256, special=special,
        add_bos=meta.get("tokenizer.ggml.add_bos_token"),
        add_eos=meta.get("tokenizer.ggml.add_eos_token"))


def _gguf_swa_layers(meta: dict[str, Any], arch: str, window: int | None,
                     block_count: int | None) -> int:
    if not (window and block_count):
        return 0
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer
        return sum(1 for flag in pattern if flag)
    n, dense_first = SWA_PATTERNS.get(arch, (int(pattern or 1), False))
    return _swa_layer_count(block_count, n, dense_first)


def _file_type_name(file_type: Any) -> str | None:
    if file_type is None:
        return None
    try:
        return FORMAT.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(file_type)


def _facts_from_gguf(path: str, meta: dict[str, Any], tensors: list[Tensor]) -> ModelFacts:
    arch = str(meta.get("general.architecture", "unknown"))

    def key(name: str) -> Any:
        value = meta.get(f"{arch}.{name}")
        return value[0] if isinstance(value, list) and value and name != "target_layers" else value

    weights = _gguf_weights(path, tensors)
    tokenizer = _gguf_tokenizer(meta)
    block_count = _int(key("block_count"))
    head_count = _int(key("attention.head_count"))
    embedding = _int(key("embedding_length"))
    head_dim = embedding // head_count if embedding and head_count else None
    window = _int(key("attention.sliding_window"))
    return ModelFacts(
        path=path, format="gguf", architecture=arch, parameters=weights.parameters,
        weight_bytes=weights.bytes, block_bits_per_weight=weights.block_bits_per_weight,
        file_type=_file_type_name(meta.get("general.file_type")), embedding_length=embedding,
        block_count=block_count, head_count=head_count,
        head_count_kv=_int(key("attention.head_count_kv")) or head_count,
        key_length=_int(key("attention.key_length")) or head_dim,
        value_length=_int(key("attention.value_length")) or head_dim,
        context_length=_int(key("context_length")),
        feed_forward_length=_int(key("feed_forward_length")),
        sliding_window=window, swa_layers=_gguf_swa_layers(meta, arch, window, block_count),
        n_vocab=tokenizer.n_tokens if tokenizer else _int(key("vocab_size")),
        tokenizer=tokenizer,
        nextn_layers=_int(key("nextn_predict_layers")) or (
            1 if any(".nextn." in name for name, _, _ in tensors) else 0),
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

@lru_cache(maxsize=32)
def _read_hf_cached(path: str, identity: FileIdentity) -> ModelFacts:  # identity: the cache key
    p = Path(path)
    config = hf.read_json(p / "config.json")
    if config is None:
        raise SpecfleetError(f"{p} has no config.json: not a Hugging Face model directory")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    weights = hf.weights(p)
    heads = text.get("num_attention_heads")
    hidden = text.get("hidden_size")
    head_dim = text.get("head_dim") or (hidden // heads if hidden and heads else None)
    tokenizer = _hf_tokenizer(p)
    arch = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
    return ModelFacts(
        path=path, format="hf", architecture=str(arch), parameters=weights.parameters,
        weight_bytes=weights.bytes, block_bits_per_weight=weights.block_bits_per_weight,
        file_type=str(text.get("torch_dtype") or config.get("torch_dtype") or "") or None,
        embedding_length=hidden, block_count=text.get("num_hidden_layers"), head_count=heads,
        head_count_kv=text.get("num_key_value_heads") or heads, key_length=head_dim,
        value_length=head_dim, context_length=text.get("max_position_embeddings"),
        feed_forward_length=text.get("intermediate_size"),
        sliding_window=text.get("sliding_window"), swa_layers=0,
        n_vocab=text.get("vocab_size") or (tokenizer.n_tokens if tokenizer else None),
        tokenizer=tokenizer, nextn_layers=int(text.get("num_nextn_predict_layers") or 0),
        target_hidden_size=text.get("target_hidden_size"))


def _hf_tokenizer(p: Path) -> Tokenizer | None:
    parsed = hf.vocabulary(p)
    if parsed is None:
        return None
    kind, vocab, added = parsed
    tokens = hf.ordered_tokens(vocab, added)
    digest = hashlib.sha256()
    for t in tokens:
        digest.update(t.encode() + b"\0")
    special, config = hf.special_tokens(p, {t: i for i, t in enumerate(tokens)})
    return Tokenizer(model=kind, pre=None, n_tokens=len(tokens), tokens_sha256=digest.hexdigest(),
                     special=special, add_bos=config.get("add_bos_token"),
                     add_eos=config.get("add_eos_token"))
