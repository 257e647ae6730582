"""The daemon with its memory watched, to find what makes its RSS grow (`soak.py
--trace-memory`).

    python benchmarks/traced_daemon.py DIR run FLEET [--json-logs]   (specfleet's own argv)
    SPECFLEET_TRACE=light ...   (no tracemalloc: the counters below only)

Every INTERVAL_S it appends to DIR/<pid>.log one line of counters that cost nothing to read:
RSS, the C allocator's books (glibc mallinfo2: bytes in use, free inside its heaps, mmapped,
arenas), Python's own (pymalloc blocks in use, objects the GC tracks) and threads. Unless
light, it also runs tracemalloc: after a warm-up (WARM_S) a snapshot, then DIR/<pid>.txt
with the sites that grew most since (grouped by the innermost frames). tracemalloc sees
Python's allocations only, and its snapshot itself holds tens of MB, so RSS is read from a
light run: RSS growth that Python's books do not show is below Python (the allocator's
arenas and their fragmentation, C extensions).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

WARM_S = 120.0
INTERVAL_S = 60.0
FRAMES = 6
TOP = 30


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def counters() -> str:
    """One line: RSS and the allocators' books, in MB (threads and objects as counts)."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    mb = 2**20
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if line.startswith(("RssAnon", "RssFile")))
    anon, files = (int(status[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile"))
    return (f"t={time.time():.0f} rss={rss_mb():.2f} anon={anon:.2f} file={files:.2f} "
            f"malloc_used={m.uordblks / mb:.2f} "
            f"malloc_free={m.fordblks / mb:.2f} malloc_heap={m.arena / mb:.2f} "
            f"malloc_mmap={m.hblkhd / mb:.2f} pymalloc_blocks={sys.getallocatedblocks()} "
            f"gc_objects={len(gc.get_objects())} threads={threading.active_count()}")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def report(out: Path, start: float, base: tracemalloc.Snapshot, base_rss: float) -> None:
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)])
    traced = sum(s.size for s in snap.statistics("filename")) / 2**20
    based = sum(s.size for s in base.statistics("filename")) / 2**20
    lines = [f"after {time.monotonic() - start:.0f} s: RSS {rss_mb():.2f} MB "
             f"({rss_mb() - base_rss:+.2f} since the warm-up), traced {traced:.2f} MB "
             f"({traced - based:+.2f})", ""]
    for stat in snap.compare_to(base, "traceback")[:TOP]:
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks "
                     f"(now {stat.size / 1024:.1f} KiB)")
        lines += [f"      {frame.filename}:{frame.lineno}" for frame in stat.traceback]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)


def watch(out: Path, log: Path, light: bool) -> None:
    start = time.monotonic()
    base: tracemalloc.Snapshot | None = None
    base_rss = 0.0
    while True:
        with log.open("a") as f:
            f.write(counters() + "\n")
        if not light and base is None and time.monotonic() - start >= WARM_S:
            base = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            base_rss = rss_mb()
        elif base is not None:
            report(out, start, base, base_rss)
        time.sleep(INTERVAL_S)


def main() -> None:
    where = Path(sys.argv[1])
    where.mkdir(parents=True, exist_ok=True)
    light = os.environ.get("SPECFLEET_TRACE") == "light"
    if not light:
        tracemalloc.start(FRAMES)
    threading.Thread(target=watch, args=(where / f"{os.getpid()}.txt",
                                         where / f"{os.getpid()}.log", light),
                     daemon=True, name="traced-daemon").start()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.argv = ["specfleet", *sys.argv[2:]]
    from supervisor.cli.main import main as specfleet
    raise SystemExit(specfleet())


if __name__ == "__main__":
    main()
