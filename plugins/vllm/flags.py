"""vLLM's command line, pure: the speculative config of each method (RUNTIMES.md), the
flags specfleet manages itself, the default draft lengths, and the largest batch a table
of lengths by load may name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.plugin import Target

# Our method names -> vLLM's SpeculativeConfig.method.
METHOD = {"draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp",
          "dflash": "dflash", "ngram": "ngram", "suffix": "suffix"}
# num_speculative_tokens when length.start is unset (vLLM requires it for most methods).
DEFAULT_LENGTH = {"draft": 5, "eagle": 3, "eagle3": 3, "dflash": 5, "mtp": 1, "ngram": 5,
                  "suffix": 24}
OPTIONS: dict[str, tuple[type, ...]] = {
    "prompt_lookup_min": (int,), "prompt_lookup_max": (int,),
    "draft_tensor_parallel_size": (int,), "served_model_name": (str,)}
MANAGED_FLAGS = {
    "--host": "host:", "--port": "port:", "--speculative-config": "speculation:",
    "--spec-method": "speculation.method:", "--spec-model": "speculation.draft:",
    "--spec-tokens": "speculation.length:", "--api-key": "api_key:",
    "--served-model-name": "options.served_model_name:",
    "--gpu-memory-utilization": "the VRAM planner (daemon.gpu)",
}

# vLLM refuses a separate draft model with its hybrid KV cache manager on models that mix
# attention kinds (Gemma 3's sliding-window layers): "All drafting layers should belong to
# the same kv cache group". The flag is a no-op for models that do not mix them.
DRAFT_FLAGS = ("--disable-hybrid-kv-cache-manager",)


def looks_local(ref: str) -> bool:
    return ref.startswith(("/", ".", "~"))


# The top of an open-ended range of requests running (vLLM clamps it to max_num_seqs).
MAX_BATCH = 4096


def speculative_config(target: Target, draft_length: int | None,
                       by_load: list[tuple[int, int | None, int]] | None = None
                       ) -> dict[str, Any] | None:
    """The `--speculative-config` JSON object for a target; pure, so every method is tested.
    `by_load`: draft lengths by requests running (num_speculative_tokens_per_batch_size;
    num_speculative_tokens is then the longest, the most the engine allocates for)."""
    spec = target.speculation
    if spec.method == "none":
        return None
    n = draft_length if draft_length is not None else (
        spec.length.start if spec.length.start is not None else DEFAULT_LENGTH[spec.method])
    config: dict[str, Any] = {"method": METHOD[spec.method], "num_speculative_tokens": n}
    if by_load:
        config["num_speculative_tokens"] = max(k for _, _, k in by_load)
        config["num_speculative_tokens_per_batch_size"] = [
            [low, high or MAX_BATCH, k] for low, high, k in by_load]
    if spec.draft:
        config["model"] = str(Path(spec.draft).expanduser()) if looks_local(spec.draft) \
            else spec.draft
    opts = target.options
    if spec.method == "ngram":
        config["prompt_lookup_min"] = opts.get("prompt_lookup_min", 2)
        config["prompt_lookup_max"] = opts.get("prompt_lookup_max", 5)
    if "draft_tensor_parallel_size" in opts and spec.method in ("draft", "eagle", "eagle3",
                                                                 "dflash"):
        config["draft_tensor_parallel_size"] = opts["draft_tensor_parallel_size"]
    return config


def flag_int(args: tuple[str, ...], flag: str) -> int | None:
    """The integer value of `flag` in `args:` (`--flag N` or `--flag=N`), if given."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            raw = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            return int(raw) if raw.isdigit() else None
    return None
