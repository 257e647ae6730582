"""Resource monitor: GPU memory, utilisation and temperature, and each target's VRAM, RSS
and CPU, every `daemon.gpu.interval`. NVML and psutil calls run in a thread, never on
the event loop (an NVML call can block for a second on a busy driver).

A target's usage is that of its whole process tree: runtimes fork helpers (vLLM's
engine core, Ollama's runner) that hold the memory, not the process specfleet started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from supervisor.config.daemonsettings import GpuSettings
from supervisor.gpu import nvml, vram


@dataclass(frozen=True)
class HeadroomAlert:
    gpu: int
    low: bool  # True: fell below the headroom; False: recovered
    message: str


def headroom_alerts(snapshot: nvml.GpuSnapshot, headroom: int,
                    low_before: frozenset[int]) -> tuple[list[HeadroomAlert], frozenset[int]]:
    """Alerts for GPUs that crossed the headroom since the last reading; pure."""
    alerts, low_now = [], set()
    for g in snapshot.gpus:
        if g.free < headroom:
            low_now.add(g.index)
            if g.index not in low_before:
                alerts.append(HeadroomAlert(g.index, True, (
                    f"GPU {g.index} ({g.name}) has {vram.gib(g.free)} free, below the "
                    f"{vram.gib(headroom)} headroom: a target that grows its KV cache or "
                    "restarts may run out of memory")))
        elif g.index in low_before:
            alerts.append(HeadroomAlert(g.index, False, (
                f"GPU {g.index} ({g.name}) is back above the headroom: {vram.gib(g.free)} free")))
    return alerts, frozenset(low_now)


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from one pass over the process table. (psutil's
    `Process.children` makes that pass on each call: once per target per reading.)"""
    out: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        out.setdefault(proc.info["ppid"], []).append(proc.pid)
    return out


class _Trees:
    """psutil.Process objects kept between readings, so cpu_percent has a baseline."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def usage(self, root_pid: int, children: dict[int, list[int]] | None = None,
              ) -> tuple[set[int], int, float]:
        """(pids of the tree, RSS bytes, CPU percent) of a process and its descendants;
        `children`: `children_by_parent()`, taken once for all the trees of a reading."""
        children = children_by_parent() if children is None else children
        members = [root_pid]
        for pid in members:  # grows while walked: breadth first
            members.extend(children.get(pid, ()))
        pids, rss, cpu = set(), 0, 0.0
        for pid in members:
            try:
                proc = self._get(pid)
                rss += proc.memory_info().rss
                cpu += proc.cpu_percent(None)
                pids.add(pid)
            except psutil.Error:
                continue
        return pids, rss, cpu

    def _get(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None or not proc.is_running():
            proc = self._procs[pid] = psutil.Process(pid)
        return proc

    def forget_dead(self) -> None:
        self._procs = {pid: p for pid, p in self._procs.items() if p.is_running()}


def read_all(pids: Mapping[str, int], trees: _Trees) -> tuple[nvml.GpuSnapshot,
                                                              dict[str, dict[str, Any]]]:
    """One reading of the GPUs and of every target's process tree; blocking."""
    snapshot = nvml.read()
    children = children_by_parent()
    out = {}
    for name, pid in pids.items():
        tree, rss, cpu = trees.usage(pid, children)
        per_gpu = nvml.attribute(snapshot, tree)
        out[name] = {"rss_bytes": rss, "cpu_percent": round(cpu, 1),
                     "vram_bytes": sum(per_gpu.values()) if snapshot.gpus else None,
                     "vram_per_gpu": {str(k): v for k, v in per_gpu.items()},
                     "processes": len(tree)}
    trees.forget_dead()
    return snapshot, out


class ResourceMonitor:
    def __init__(self, settings: GpuSettings, pids: Callable[[], Mapping[str, int]],
                 publish: Callable[[str, dict[str, Any]], None],
                 alert: Callable[[HeadroomAlert], None]) -> None:
        self.settings = settings
        self._pids = pids
        self._publish = publish
        self._alert = alert
        self._trees = _Trees()
        self._low: frozenset[int] = frozenset()
        self.snapshot = nvml.GpuSnapshot(unavailable="not read yet")

    async def read_once(self) -> None:
        snapshot, usage = await asyncio.to_thread(read_all, dict(self._pids()), self._trees)
        self.snapshot = snapshot
        for name, data in usage.items():
            self._publish(name, data)
        alerts, self._low = headroom_alerts(snapshot, self.settings.headroom, self._low)
        for a in alerts:
            self._alert(a)

    async def run(self) -> None:
        while True:
            await self.read_once()
            await asyncio.sleep(self.settings.interval)
