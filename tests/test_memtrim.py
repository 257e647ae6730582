"""memtrim: the daemon's once-a-minute malloc_trim hands freed heap pages back (RSS follows
what is in use: the soak's RSS growth, docs/reliability.md)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from supervisor.daemon import memtrim


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
