"""llama-server's command line, pure: the flags of each speculation method and n-gram
variant, the flags specfleet manages itself, the context settings read back from `args:`,
and the checks of `--help` and of a GGUF path (RUNTIMES.md has the flags)."""

from __future__ import annotations

import errno
import re
import stat
from pathlib import Path

from supervisor.plugin import MISSING, ContextSettings, Problem, Target, gguf_incomplete

SPEC_TYPE = {
    "draft": "draft-simple",
    "eagle3": "draft-eagle3",
    "mtp": "draft-mtp",
    "dflash": "draft-dflash",
}
# The flag that sets "how many tokens one step drafts" for each n-gram variant;
# ngram-cache always drafts 8 and has nothing to tune.
NGRAM_LENGTH_FLAG = {
    "mod": "--spec-ngram-mod-n-max",
    "simple": "--spec-ngram-simple-size-m",
    "map-k": "--spec-ngram-map-k-size-m",
    "map-k4v": "--spec-ngram-map-k4v-size-m",
    "cache": None,
}
DEFAULT_NGRAM_VARIANT = "mod"
# llama.cpp's defaults for those flags (common/common.h, b11434).
NGRAM_DEFAULT_LENGTH = {"mod": 64, "simple": 48, "map-k": 48, "map-k4v": 48, "cache": 8}
# Flags specfleet owns: a second spelling in `args:` would fight the supervisor.
MANAGED_FLAGS = {
    "--port": "port:", "--host": "host:", "-m": "model:", "--model": "model:",
    "--metrics": "nothing (specfleet always enables /metrics)",
    "--spec-type": "speculation.method:", "-md": "speculation.draft:",
    "--model-draft": "speculation.draft:", "--spec-draft-model": "speculation.draft:",
    "--spec-draft-n-max": "speculation.length.start:", "--api-key": "api_key:",
    "--api-key-file": "api_key:",
}
# Removed in the 2026 rename; current builds reject them.
REMOVED_FLAGS = {"--draft": "speculation.length", "--draft-n": "speculation.length",
                 "--draft-max": "speculation.length", "--draft-min": "speculation.length"}


# Flags that size memory, by every spelling llama-server accepts (b11434).
_CTX_FLAGS = {"-c": "ctx", "--ctx-size": "ctx", "-np": "parallel", "--parallel": "parallel",
              "-ub": "ubatch", "--ubatch-size": "ubatch", "-ctk": "cache_type_k",
              "--cache-type-k": "cache_type_k", "-ctv": "cache_type_v",
              "--cache-type-v": "cache_type_v", "-ngl": "gpu_layers", "--gpu-layers": "gpu_layers",
              "--n-gpu-layers": "gpu_layers"}
_CTX_SWITCHES = {"--swa-full": ("swa_full", True), "-kvu": ("unified", True),
                 "--kv-unified": ("unified", True), "-no-kvu": ("unified", False),
                 "--no-kv-unified": ("unified", False)}
AUTO_PARALLEL = 4  # llama-server's choice for --parallel -1 (auto), with a unified KV cache



def method_args(target: Target, draft_length: int | None, speculation: bool = True) -> list[str]:
    """The speculation flags for a target; pure, so every method is unit-tested."""
    spec = target.speculation
    n = draft_length if draft_length is not None else spec.length.start
    if spec.method == "none" or not speculation:
        return []
    if spec.method == "ngram":
        variant = spec.variant or DEFAULT_NGRAM_VARIANT
        args = ["--spec-type", f"ngram-{variant}"]
        flag = NGRAM_LENGTH_FLAG[variant]
        if flag and n is not None:
            args += [flag, str(n)]
            if variant == "mod":
                # ngram-mod discards drafts shorter than n-min (default 48 of 64): keep the
                # same 3:4 ratio so a short n-max still drafts. args: may override it.
                args += ["--spec-ngram-mod-n-min", str(max(1, n * 3 // 4))]
        return args
    args = ["--spec-type", SPEC_TYPE[spec.method]]
    if spec.draft:
        args += ["--spec-draft-model", str(Path(spec.draft).expanduser())]
    if n is not None:
        args += ["--spec-draft-n-max", str(n)]
    return args


def context_settings(args: tuple[str, ...] | list[str]) -> ContextSettings:
    """The memory-sizing settings that a target's `args:` give llama-server; pure."""
    found: dict[str, object] = {}
    it = iter(args)
    for arg in it:
        flag, eq, inline = arg.partition("=")
        if flag in _CTX_SWITCHES:
            key, value = _CTX_SWITCHES[flag]
            found[key] = value
        elif flag in _CTX_FLAGS:
            raw = inline if eq else next(it, "")
            key = _CTX_FLAGS[flag]
            if key.startswith("cache_type"):
                found[key] = raw
            elif key == "gpu_layers":
                found[key] = None if raw in ("auto", "all", "") else int(raw) if raw.lstrip(
                    "-").isdigit() else None
            elif raw.lstrip("-").isdigit():
                found[key] = int(raw)
    parallel = found.pop("parallel", -1)
    auto = not isinstance(parallel, int) or parallel <= 0
    unified = found.pop("unified", auto)  # llama-server unifies the cache when it picks -np
    return ContextSettings(parallel=AUTO_PARALLEL if auto else int(parallel),  # type: ignore[arg-type]
                                unified=bool(unified), **found)  # type: ignore[arg-type]


def check_help_text(help_text: str) -> str | None:
    """Why this llama-server cannot run speculative targets, or None if it can."""
    if "--spec-type" in help_text:
        return None
    if re.search(r"--draft-max|--draft-n\b|--model-draft", help_text):
        return ("this llama-server build is too old: it predates the 2026 rename of the "
                "speculative-decoding flags (--spec-type, --spec-draft-n-max, "
                "--spec-draft-model) that specfleet uses; upgrade llama.cpp, or run "
                "`specfleet setup` to build a current llama-server")
    return ("this llama-server does not list --spec-type in --help, so it cannot run "
            "speculative decoding as specfleet configures it; upgrade llama.cpp")


def gguf_file_problem(where: tuple[str, ...], kind: str, value: str) -> Problem | None:
    """Why `value` cannot be the `kind` ("model", "draft") GGUF file llama-server opens, or
    None when it is a whole regular file. A file that is not there (yet), cannot be read or
    is shorter than its header says is what the host lacks (MISSING: the target waits for
    it); a directory or a device in its place is the file's mistake."""
    path = Path(value).expanduser()
    shown = f"{kind} file {str(path)!r}"
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            if path.suffix != ".gguf" and not path.parent.exists():
                return Problem(where, f"{shown} does not exist; llama-server takes a local "
                               ".gguf file")
            return Problem(where, f"{shown} does not exist", MISSING)
        return Problem(where, f"{shown} cannot be read: {exc.strerror or exc}", MISSING)
    if stat.S_ISDIR(mode):
        return Problem(where, f"{shown} is a directory, expected a GGUF file")
    if not stat.S_ISREG(mode):
        return Problem(where, f"{shown} is not a regular file, expected a GGUF file")
    why = gguf_incomplete({kind: str(path)})  # a download that did not finish
    return Problem(where, why, MISSING) if why is not None else None
