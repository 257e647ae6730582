"""NVIDIA GPU readings through NVML (nvidia-ml-py). Blocking calls: run them in a thread.

"No NVIDIA GPU" is a normal state, reported with NVML's own reason (library not
found, driver not loaded, no device), never an exception to the caller.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import pynvml

_lock = threading.Lock()  # NVML is thread-safe, but init/shutdown counting is ours
_initialised = False
_init_error: str | None = None


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    uuid: str
    total: int
    used: int
    free: int
    utilization: int | None  # percent, over the driver's last sample period
    temperature: int | None  # degrees C
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes on this GPU


@dataclass(frozen=True)
class GpuSnapshot:
    gpus: tuple[GpuReading, ...] = ()
    unavailable: str | None = None  # why there are no readings, in words

    def to_dict(self) -> dict[str, object]:
        return {"unavailable": self.unavailable,
                "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "total": g.total,
                          "used": g.used, "free": g.free, "utilization": g.utilization,
                          "temperature": g.temperature} for g in self.gpus]}


def _init() -> str | None:
    """Initialise NVML once per process; the reason it is unavailable, or None."""
    global _initialised, _init_error
    with _lock:
        if _initialised or _init_error is not None:
            return _init_error
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _init_error = f"no NVIDIA GPU: NVML is unavailable ({exc})"
            return _init_error
        _initialised = True
        return None


def read() -> GpuSnapshot:
    """One reading of every GPU; blocking (tens of ms per GPU)."""
    if (why := _init()) is not None:
        return GpuSnapshot(unavailable=why)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return GpuSnapshot(unavailable=f"NVML cannot count GPUs ({exc})")
    if count == 0:
        return GpuSnapshot(unavailable="no NVIDIA GPU: NVML reports 0 devices")
    return GpuSnapshot(tuple(_read_one(i) for i in range(count)))


def _read_one(index: int) -> GpuReading:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else str(name)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    util = temp = None
    with contextlib.suppress(pynvml.NVMLError):
        util = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    with contextlib.suppress(pynvml.NVMLError):
        temp = int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    processes: dict[int, int] = {}
    for getter in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                   pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            for p in getter(handle):
                # usedGpuMemory is None where the driver hides it (some containers, MIG).
                processes[int(p.pid)] = processes.get(int(p.pid), 0) + int(p.usedGpuMemory or 0)
        except pynvml.NVMLError:
            pass
    return GpuReading(index, name, uuid, int(mem.total), int(mem.used), int(mem.free), util,
                      temp, processes)


def attribute(snapshot: GpuSnapshot, tree_pids: set[int]) -> dict[int, int]:
    """Bytes per GPU used by a process tree (the runtime and every child it started)."""
    out: dict[int, int] = {}
    for gpu in snapshot.gpus:
        used = sum(n for pid, n in gpu.processes.items() if pid in tree_pids)
        if used:
            out[gpu.index] = used
    return out
