"""Small GGUF files written with the gguf package's own writer, for the pairing guard tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VOCAB = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"tok{i}" for i in range(5, 300)]


def write_model(path: Path, *, arch: str = "llama", n_embd: int = 64, n_layers: int = 2,
                n_ff: int = 128, tokens: list[str] | None = None, bos: int = 2, eos: int = 1,
                qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q8_0,
                tokenizer_model: str = "llama", extra: dict[str, object] | None = None) -> Path:
    """A model whose blocks hold two n_embd x n_ff matrices each, quantized as `qtype`."""
    tokens = VOCAB if tokens is None else tokens
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_tokenizer_model(tokenizer_model)
    w.add_token_list(tokens)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    for key, value in (extra or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, str(value))
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), n_embd), np.float32))
    for i in range(n_layers):
        for name in ("ffn_up", "ffn_down"):
            data = rng.standard_normal((n_ff, n_embd), dtype=np.float32)
            if qtype != gguf.GGMLQuantizationType.F32:
                w.add_tensor(f"blk.{i}.{name}.weight", gguf.quants.quantize(data, qtype),
                             raw_dtype=qtype)
            else:
                w.add_tensor(f"blk.{i}.{name}.weight", data)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
