"""Models derived from a GGUF file with ggml's own `gguf` package: a slow target and a
draft that agrees with it only part of the time, for tuning where the draft length matters
(`specfleet setup --pair`, docs/tuning.md "A real draft-model pair").

- `dequantized`: every quantized tensor turned into F32. The same weights as the source, only slower: the
  source drafting for it agrees almost always.
- `without_blocks`: the source with some transformer blocks left out (their tensors
  dropped, the later ones renumbered, the block count lowered), quantized data copied as
  is: a faster, worse model with the same tokenizer, a draft that agrees part of the time
  (self-speculative drafting by layer skipping, as in LayerSkip and Draft&Verify).

Both copy every metadata key but the ones they change; a file is written beside its final
name and renamed, so a cache never holds a half-written model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

_BLOCK = re.compile(r"^blk\.(\d+)\.(.*)$")


def _gguf():  # type: ignore[no-untyped-def]
    import gguf  # a dependency; imported here so that `specfleet check` does not pay for it

    return gguf


def _copy_fields(reader, writer, changed: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    gguf = _gguf()
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = changed.get(field.name, field.contents())
        writer.add_key_value(field.name, value, kind, sub_type=sub)


def _write(reader, dest: Path, changed: dict[str, int],  # type: ignore[no-untyped-def]
           tensors: Iterable[tuple[str, np.ndarray, object | None]]) -> Path:
    """Write `dest` from the source `reader` holds: its metadata with `changed` applied, and
    `tensors` as (name, data, raw type or None for a plain numpy array)."""
    gguf = _gguf()
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    partial = dest.with_name(dest.name + ".partial")
    writer = gguf.GGUFWriter(partial, arch)
    _copy_fields(reader, writer, changed)
    for name, data, raw in tensors:
        if raw is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, dest)
    return dest


def dequantized(source: Path, dest: Path) -> Path:
    """`source` with every tensor in F32."""
    gguf = _gguf()
    reader = gguf.GGUFReader(source)
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)

    def tensors():  # type: ignore[no-untyped-def]
        for t in reader.tensors:
            data = t.data if t.tensor_type in plain else gguf.quants.dequantize(
                t.data, t.tensor_type)
            shape = tuple(int(n) for n in reversed(t.shape))  # numpy's order: ne0 last
            yield t.name, np.asarray(data, dtype=np.float32).reshape(shape), None

    return _write(reader, dest, {}, tensors())


def without_blocks(source: Path, dest: Path, drop: Iterable[int]) -> Path:
    """`source` without the transformer blocks in `drop` (later blocks renumbered)."""
    gguf = _gguf()
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = f"{arch}.block_count"
    blocks = int(reader.fields[count_key].contents())
    dropped = sorted(set(drop))
    if not dropped or dropped[0] < 0 or dropped[-1] >= blocks:
        raise ValueError(f"blocks to drop must be within 0..{blocks - 1}: {dropped}")
    kept = [b for b in range(blocks) if b not in dropped]
    renumber = {old: new for new, old in enumerate(kept)}

    def tensors():  # type: ignore[no-untyped-def]
        for t in reader.tensors:
            name = t.name
            if m := _BLOCK.match(name):
                block = int(m.group(1))
                if block not in renumber:
                    continue
                name = f"blk.{renumber[block]}.{m.group(2)}"
            # Quantized data as stored (bytes; its logical shape is what the header says).
            yield name, t.data, t.tensor_type

    return _write(reader, dest, {count_key: len(kept)}, tensors())
