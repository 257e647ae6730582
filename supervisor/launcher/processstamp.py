"""Which process a recorded pid belonged to. A pid is reused, so a record keeps when its process
started; comparing that later must give the same answer for the same process however long ago
it was recorded.

psutil's `create_time()` is the kernel's boot time (the wall clock now minus the uptime, in whole
seconds) plus the process's start tick, so it moves by a second when NTP slews the clock across a
second boundary, and by any amount when the clock is stepped: the same process can read 1 s
"younger" an hour later. The stamp therefore keeps what never moves: the boot's id and the start
tick since boot. `create_time` stays in the stamp for people (the status page shows it) and for
records written before the tick was kept, which are compared with a tolerance wider than a slew.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

# A record without ticks is compared by wall clock; a step larger than this reads as another
# process (the safe side: a live daemon is reported as gone, an orphan is not killed).
WALL_TOLERANCE = 2.0  # seconds

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """Clock ticks from boot to the process's start (field 22 of /proc/PID/stat); the command
    name before it may hold spaces and parentheses, so the fields are read after its last ')'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def stamp(pid: int) -> dict[str, Any]:
    """pid, wall-clock create time, boot id and start tick of a running process; raises
    psutil.Error when there is no such process."""
    record: dict[str, Any] = {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    ticks, boot = start_ticks(pid), boot_id()
    if ticks is not None and boot is not None:
        record.update(start_ticks=ticks, boot_id=boot)
    return record


def same_process(record: dict[str, Any]) -> bool:
    """The process in `record` (from `stamp`) is still running: same pid, same boot, same start
    tick. False for a malformed record or a pid that is gone or now belongs to another process."""
    try:
        pid = int(record["pid"])
        if "start_ticks" in record and "boot_id" in record:
            # A pid that is gone has no start tick (None): not the same process.
            return record["boot_id"] == boot_id() and \
                start_ticks(pid) == int(record["start_ticks"])
        return abs(psutil.Process(pid).create_time() - float(record["create_time"])) \
            < WALL_TOLERANCE
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False

