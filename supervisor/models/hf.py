"""Hugging Face model directories (vLLM targets): config.json, tokenizer files, safetensors.

Only what the files say, read as cheaply as they allow: JSON files whole, safetensors
files by their header alone. What it means is `supervisor.models.facts`' business.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import SpecfleetError


@dataclass(frozen=True)
class Weights:
    """Totals over the tensors of a model: every safetensors shard of a directory here, the
    tensor infos of a GGUF in `supervisor.models.facts`."""

    parameters: int = 0
    bytes: int = 0
    block_parameters: int = 0  # 2-D tensors of the transformer layers (blocks)
    block_bytes: int = 0

    @property
    def block_bits_per_weight(self) -> float | None:
        return round(8 * self.block_bytes / self.block_parameters, 2) if self.block_parameters else None


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file; None when it is missing (or not an object)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecfleetError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else None


def safetensors_header(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise SpecfleetError(f"cannot read the safetensors header of {path}: {exc}") from exc
    return header if isinstance(header, dict) else {}


def weights(directory: Path) -> Weights:
    params = nbytes_total = block_params = block_bytes = 0
    for shard in sorted(directory.glob("*.safetensors")):
        for name, info in safetensors_header(shard).items():
            if name == "__metadata__":
                continue
            n = 1
            for d in info["shape"]:
                n *= d
            nbytes = info["data_offsets"][1] - info["data_offsets"][0]
            params += n
            nbytes_total += nbytes
            if ".layers." in name and len(info["shape"]) >= 2:
                block_params += n
                block_bytes += nbytes
    return Weights(params, nbytes_total, block_params, block_bytes)


def vocabulary(directory: Path) -> tuple[str, dict[str, int], list[dict[str, Any]]] | None:
    """(tokenizer model type, vocabulary, added tokens) from tokenizer.json, if there is one."""
    data = read_json(directory / "tokenizer.json")
    if data is None:
        return None
    model = data.get("model") or {}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    return str(model.get("type", "unknown")), vocab, list(data.get("added_tokens") or [])


def tokens(directory: Path) -> list[str]:
    """The token texts in id order (added tokens included); [] without tokenizer.json."""
    parsed = vocabulary(directory)
    if parsed is None:
        return []
    _, vocab, added = parsed
    return ordered_tokens(vocab, added)


def ordered_tokens(vocab: dict[str, int], added: list[dict[str, Any]]) -> list[str]:
    by_id = {i: t for t, i in vocab.items()}
    by_id.update({int(a["id"]): str(a["content"]) for a in added})
    return [by_id.get(i, "") for i in range(max(by_id) + 1)] if by_id else []


def special_tokens(directory: Path, ids: dict[str, int]) -> tuple[dict[str, int], dict[str, Any]]:
    """(bos/eos/unknown/padding -> id, tokenizer_config.json) for a vocabulary `ids`."""
    config = read_json(directory / "tokenizer_config.json") or {}
    special: dict[str, int] = {}
    for name, hf_key in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"),
                         ("padding", "pad_token")):
        value = config.get(hf_key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value in ids:
            special[name] = ids[value]
    return special, config
