"""glibc tuned as the daemon starts, and its free pages handed back once a minute.

The soak (docs/reliability.md, "What grows in the daemon") saw the daemon's RSS grow by
megabytes an hour. Part of it is below Python: buffers over pymalloc's 512 bytes (HTTP
bodies, the status endpoints' JSON, the proxy's relayed chunks) come and go in several glibc
arenas (each thread that allocates gets one: asyncio.to_thread's workers), and a heap whose
top is in use cannot shrink, so freed pages stay resident. malloc_trim(0) returns every whole
free page of every arena (madvise). Measured, it is a small part of the cure and gives back
transient peaks; pymalloc's arenas are out of its
reach. It takes a few milliseconds; elsewhere than glibc (musl, macOS) there is nothing to
call and nothing is done.

`tune_allocator`, called once as the daemon starts, goes at the cause (glibc's heaps grew,
nearly all of it free space inside them: docs/reliability.md has the runs): glibc raises its mmap
threshold each time a large block it had mmapped is freed (up to 32 MB), after which such
blocks come from the heap and pin it; a fixed threshold keeps them mmapped and given back at
free. And at most two arenas: each thread that allocates (asyncio.to_thread's workers)
would otherwise get one of its own, each fragmenting apart. `SPECFLEET_MALLOPT=off` leaves
glibc's defaults (to measure what it does: benchmarks/README.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

PERIOD_S = 60.0
# mallopt(3)'s parameters and the values set: blocks from 128 KiB up (glibc's initial
# threshold, kept fixed) are mmapped; two arenas.
M_MMAP_THRESHOLD, MMAP_THRESHOLD = -3, 128 * 1024
M_ARENA_MAX, ARENA_MAX = -8, 2


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def tune_allocator() -> bool:
    """Set glibc's mmap threshold and arena count (see above); whether both were set."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or os.environ.get("SPECFLEET_MALLOPT") == "off":
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_ARENA_MAX, ARENA_MAX))


def trimmer() -> Callable[[], int] | None:
    """glibc's malloc_trim(0) as a callable returning whether memory was released, or None
    where the C library has no such call or SPECFLEET_MALLOC_TRIM=off (to measure what it
    does: benchmarks/README.md, the soak)."""
    if os.environ.get("SPECFLEET_MALLOC_TRIM") == "off":
        return None
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(trim(0))
