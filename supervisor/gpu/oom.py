"""Recognising out-of-memory deaths: the runtimes' own messages and the kernel OOM killer.

The messages are those of llama.cpp b11434 (ggml-cuda.cu, ggml-backend.cpp, ggml-alloc.c,
llama-model.cpp, llama-kv-cache.cpp) and of vLLM / PyTorch; backends use `search` on the
output tail. The kernel OOM killer leaves no message in the victim's output: it is seen
as a SIGKILL that specfleet did not send, together with a rise of `oom_kill` in the
memory.events of the victim's cgroup (cgroup v2).
"""

from __future__ import annotations

import re
from pathlib import Path

GPU_OOM = re.compile(
    r"cudaMalloc failed: out of memory[^\n]*|CUDA error: out of memory|"
    r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: CUDA out of memory[^\n]*|"
    r"failed to allocate CUDA\d* buffer of size \d+|unable to allocate CUDA\d* buffer|"
    r"Free memory on device[^\n]*less than desired GPU memory utilization[^\n]*|"
    r"No available memory for the cache blocks[^\n]*")
HOST_OOM = re.compile(
    r"std::bad_alloc|failed to allocate CPU buffer of size \d+|unable to allocate CPU buffer|"
    r"failed to allocate buffer for kv cache|MemoryError\b")


def search(output: str) -> str | None:
    """The out-of-memory message in a runtime's output, or None."""
    for pattern in (GPU_OOM, HOST_OOM):
        if m := pattern.search(output):
            return m.group(0).strip()
    return None


def cgroup_of(pid: int) -> Path | None:
    """The cgroup v2 directory of a process, or None (v1 hierarchy, gone, no access)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            return path if (path / "memory.events").exists() else None
    return None


def oom_kills(cgroup: Path | None) -> int | None:
    """The cgroup's oom_kill counter (memory.events), or None if it cannot be read."""
    if cgroup is None:
        return None
    try:
        text = (cgroup / "memory.events").read_text()
    except OSError:
        return None
    return parse_memory_events(text).get("oom_kill")


def parse_memory_events(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out
