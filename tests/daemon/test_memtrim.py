"""memtrim: the daemon's once-a-minute malloc_trim hands freed heap pages back (RSS follows
what is in use: the soak's RSS growth, docs/reliability.md)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.daemon import memtrim
from tests.conftest import REPO


def rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_returns_the_free_pages_inside_a_fragmented_heap():
    trim = memtrim.trimmer()
    assert trim is not None
    # 40 MB of buffers above pymalloc's 512 bytes (so from malloc's heap), every 20th kept:
    # the heap's top stays in use, so freeing the rest leaves its pages resident.
    buffers = [bytes(2000) + bytes([i % 256]) for i in range(20_000)]
    kept = buffers[::20]
    del buffers
    before = rss_anon_mb()
    assert trim() == 1  # something was released
    after = rss_anon_mb()
    assert before - after > 10, (before, after)
    assert len(kept) == 1000


def test_it_can_be_turned_off_to_measure_what_it_does(monkeypatch):
    monkeypatch.setenv("SPECFLEET_MALLOC_TRIM", "off")
    assert memtrim.trimmer() is None


# In a fresh interpreter: malloc a block of 1 MiB (mmapped: over glibc's initial threshold),
# free it (glibc's default then raises its threshold to 1 MiB), and malloc 256 KiB: print
# how much of it came mmapped (mallinfo2's hblkhd grew) rather than from the heap.
AFTER_A_FREED_LARGE_BLOCK = """
import ctypes, os, sys
from supervisor.daemon import memtrim
if sys.argv[1] == "tuned":
    assert memtrim.tune_allocator()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(1 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(256 << 10)
print(libc.mallinfo2().hblkhd - before >= 256 << 10)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's parameters are glibc's")
@pytest.mark.parametrize(("mode", "mmapped"), [("tuned", "True"), ("default", "False")])
def test_with_the_allocator_tuned_a_large_block_stays_mmapped_after_a_larger_one_was_freed(
        mode, mmapped):
    out = subprocess.run([sys.executable, "-c", AFTER_A_FREED_LARGE_BLOCK, mode],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         env={**{k: v for k, v in os.environ.items()  # glibc's own knobs
                                 if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))},
                              "SPECFLEET_MALLOPT": ""})
    assert out.stdout.strip() == mmapped


def test_the_allocator_tuning_can_be_turned_off_to_measure_what_it_does(monkeypatch):
    monkeypatch.setenv("SPECFLEET_MALLOPT", "off")
    assert memtrim.tune_allocator() is False
