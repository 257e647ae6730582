"""Hand the C allocator's free pages back to the system, once a minute.

The soak (docs/reliability.md, "What grows in the daemon") saw the daemon's RSS grow by
megabytes an hour. Part of it is below Python: buffers over pymalloc's 512 bytes (HTTP
bodies, the status endpoints' JSON, the proxy's relayed chunks) come and go in several glibc
arenas (each thread that allocates gets one: asyncio.to_thread's workers), and a heap whose
top is in use cannot shrink, so freed pages stay resident. malloc_trim(0) returns every whole
free page of every arena (madvise). Measured, it is a small part of the cure (0.86x the
growth over 16 minutes) and gives back transient peaks; pymalloc's arenas are out of its
reach. It takes a few milliseconds; elsewhere than glibc (musl, macOS) there is nothing to
call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

PERIOD_S = 60.0


def trimmer() -> Callable[[], int] | None:
    """glibc's malloc_trim(0) as a callable returning whether memory was released, or None
    where the C library has no such call or SPECFLEET_MALLOC_TRIM=off (to measure what it
    does: benchmarks/README.md, the soak)."""
    if os.environ.get("SPECFLEET_MALLOC_TRIM") == "off":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(trim(0))
