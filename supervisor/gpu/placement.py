"""The daemon's VRAM placement: one plan for the fleet, a check before every start.

The plan (gpu/vram.py) is made for the whole fleet at start and at reload,
against each GPU's free memory as NVML reads it (plus what this fleet's own targets
hold, at a reload) or against the memory the fleet file declares. Before each start
the target's share is checked again against a fresh reading, minus what targets that
are still loading will take: another program may have taken the memory meanwhile.
Without an NVIDIA GPU and without declared memory nothing is planned; that is said
once, plainly, and targets start where their runtime puts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

from supervisor.config.daemonsettings import GpuSettings
from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError, StartRefused
from supervisor.gpu import nvml, vram


class _Traits(Protocol):
    local_gpus: bool


class Planned(Protocol):
    """What the plan needs of a target's backend (plugin/backend.py's Backend is one)."""

    target: Target
    fills_gpu_memory: bool

    @property
    def launcher_traits(self) -> _Traits: ...

    def memory_estimate(self, on_gpu: bool) -> vram.Estimate | None: ...


@dataclass
class FleetPlan:
    """The plan plus what could not be planned, for `specfleet check` and the status."""

    source: str  # "nvml" | "declared" | "none"
    plan: vram.Plan | None
    estimates: dict[str, vram.Estimate | None] = field(default_factory=dict)
    on_gpu: dict[str, bool] = field(default_factory=dict)
    unavailable: str | None = None  # why nothing was planned
    host_warning: str | None = None  # targets on the CPU that may not fit in RAM


def devices_from(snapshot: nvml.GpuSnapshot, settings: GpuSettings,
                 ours: Mapping[int, int] | None = None) -> tuple[list[vram.Device], str]:
    """Devices to plan against and where their numbers come from."""
    if snapshot.gpus:
        return [vram.Device(g.index, g.name, g.total, g.free + (ours or {}).get(g.index, 0))
                for g in snapshot.gpus], "nvml"
    if settings.memory:
        return [vram.Device(i, "declared", m, m) for i, m in enumerate(settings.memory)], \
            "declared"
    return [], "none"


def held_vram(resources: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """VRAM per GPU held by targets, from the monitor's readings of each."""
    held: dict[int, int] = {}
    for r in resources:
        for gpu, n in (r.get("vram_per_gpu") or {}).items():
            held[int(gpu)] = held.get(int(gpu), 0) + int(n)
    return held


def make_plan(backends: Mapping[str, Planned], snapshot: nvml.GpuSnapshot,
              settings: GpuSettings, ours: Mapping[int, int] | None = None,
              host_available: int | None = None) -> FleetPlan:
    """Plan the fleet; blocking (reads model headers)."""
    devices, source = devices_from(snapshot, settings, ours)
    demands, estimates, on_gpu = [], {}, {}
    for name, backend in backends.items():
        if not backend.launcher_traits.local_gpus:
            # A server already running (its memory is in the readings already), or another
            # machine's GPUs, which that launcher counts (Ray: docs/ray.md).
            continue
        gpu = bool(devices) and backend.target.gpus != "none"
        on_gpu[name] = gpu
        try:
            estimates[name] = estimate = backend.memory_estimate(on_gpu=gpu)
        except SpecfleetError:
            estimates[name] = estimate = None
        if gpu and estimate is not None:
            demands.append(vram.Demand(name, estimate, backend.target.gpus,  # type: ignore[arg-type]
                                       backend.fills_gpu_memory, backend.target.swaps))
    result = FleetPlan(source, vram.plan_fleet(demands, devices, settings.headroom)
                       if devices else None, estimates, on_gpu)
    if not devices:
        result.unavailable = (f"cannot plan VRAM: {snapshot.unavailable or 'no GPU readings'}, "
                              "and daemon.gpu.memory declares none; targets start where their "
                              "runtime puts them")
    on_host = sum(e.total for n, e in estimates.items() if e is not None and not on_gpu[n])
    if host_available is not None and on_host > host_available:
        result.host_warning = (f"targets on the CPU need about {vram.gib(on_host)} of memory "
                               f"and {vram.gib(host_available)} is available: they may swap "
                               "or be killed by the kernel's OOM killer")
    return result


def assignment_in(fp: FleetPlan, name: str) -> vram.Assignment | None:
    return fp.plan.assignments.get(name) if fp.plan is not None else None


def render(fp: FleetPlan) -> str:
    """The plan as the table `specfleet check` prints."""
    lines = []
    if fp.plan is not None:
        src = "NVML free memory" if fp.source == "nvml" else "declared memory (daemon.gpu.memory)"
        lines.append(f"VRAM plan against {src}, headroom {vram.gib(fp.plan.headroom)} per GPU:")
        for d in fp.plan.devices:
            lines.append(f"  GPU {d.index} {d.name}: {vram.gib(d.free)} free of "
                         f"{vram.gib(d.total)}, {vram.gib(fp.plan.planned.get(d.index, 0))} "
                         "planned")
    elif fp.unavailable:
        lines.append(fp.unavailable + ". Estimates:")
    rows = [("TARGET", "WHERE", "WEIGHTS", "KV CACHE", "COMPUTE", "TOTAL", "PLACEMENT")]
    for name, est in fp.estimates.items():
        if est is None:
            rows.append((name, "-", "-", "-", "-", "-", "no estimate (model not readable here)"))
            continue
        placement = "CPU / host memory" if not fp.on_gpu.get(name) else "-"
        if fp.plan is not None and fp.on_gpu.get(name):
            if name in fp.plan.refused:
                placement = "REFUSED: " + fp.plan.refused[name]
            elif (a := fp.plan.assignments.get(name)) is not None:
                placement = "GPU " + ",".join(map(str, a.gpus)) + (
                    f", memory fraction {a.memory_fraction:.3f}" if a.memory_fraction else "")
        rows.append((name, "GPU" if fp.on_gpu.get(name) else "CPU", vram.gib(est.weights),
                     vram.gib(est.kv), vram.gib(est.compute + est.output + est.overhead),
                     vram.gib(est.total), placement))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
                     + "  " + row[-1])
    lines += _swap_lines(fp)
    if fp.host_warning:
        lines.append("warning: " + fp.host_warning)
    return "\n".join(lines)


def _swap_lines(fp: FleetPlan) -> list[str]:
    """The worst case when on-demand targets do not all fit at once (docs/on-demand.md)."""
    plan = fp.plan
    if plan is None or plan.room is None:
        return []
    room = ", ".join(f"GPU {g} {vram.gib(max(0, n))}" for g, n in sorted(plan.room.items()))
    return [f"On-demand targets do not all fit at once: they share {room} left by the "
            "targets that always run.",
            f"  the most that run at once: {', '.join(plan.at_once) or 'none'}",
            f"  swapped in on demand (evicting the least recently used): "
            f"{', '.join(plan.swapped) or 'none'}"]


class Placer:
    """Holds the fleet plan and the reservations of targets that are still loading."""

    def __init__(self, settings: GpuSettings) -> None:
        self.settings = settings
        self.fleet_plan: FleetPlan | None = None
        self._loading: dict[str, dict[int, int]] = {}  # target -> bytes per GPU not yet in NVML
        self._said_unavailable = False

    async def replan(self, backends: Mapping[str, Planned],
                     ours: Mapping[int, int] | None = None) -> FleetPlan:
        snapshot = await asyncio.to_thread(nvml.read)
        host = psutil.virtual_memory().available
        self.fleet_plan = await asyncio.to_thread(make_plan, backends, snapshot, self.settings,
                                                  ours, host)
        return self.fleet_plan

    def assignment(self, name: str) -> vram.Assignment | None:
        return assignment_in(self.fleet_plan, name) if self.fleet_plan else None

    async def check_start(self, name: str) -> vram.Assignment | None:
        """The placement for a start; raise StartRefused if it does not fit (with numbers)."""
        fp = self.fleet_plan
        if fp is None or fp.plan is None or not fp.on_gpu.get(name):
            return None
        if name in fp.plan.refused:
            self._refuse(name, fp.plan.refused[name])
            return None
        assignment = fp.plan.assignments.get(name)
        if assignment is None:
            return None
        fits, detail = await self.fits_now(name)
        if fits is False:
            self._refuse(name, detail)
        self._loading[name] = dict(assignment.per_gpu)
        return assignment

    def _refuse(self, name: str, why: str) -> None:
        message = f"target '{name}' does not fit in GPU memory: {why}"
        if self.settings.refuse:
            raise StartRefused(message + " (daemon.gpu.refuse: false starts it anyway)")

    async def fits_now(self, name: str) -> tuple[bool | None, str]:
        """Does this target's share fit in what the GPUs have free right now? None: cannot
        tell (no live readings: declared memory is planned once, for the whole fleet)."""
        assignment = self.assignment(name)
        fp = self.fleet_plan
        if assignment is None or fp is None or fp.source != "nvml":
            return None, "no live GPU readings"
        snapshot = await asyncio.to_thread(nvml.read)
        by_index = {g.index: g for g in snapshot.gpus}
        for gpu, need in assignment.per_gpu.items():
            reading = by_index.get(gpu)
            if reading is None:
                return False, f"GPU {gpu} is no longer visible to NVML"
            pending = sum(r.get(gpu, 0) for t, r in self._loading.items() if t != name)
            room = reading.free - self.settings.headroom - pending
            if need > room:
                return False, (f"needs {vram.gib(need)} on GPU {gpu} ({reading.name}) but "
                               f"{vram.gib(max(0, room))} is free after "
                               f"{vram.gib(self.settings.headroom)} headroom"
                               + (f" and {vram.gib(pending)} for targets still loading"
                                  if pending else ""))
        return True, "fits"

    def released(self, name: str) -> None:
        """The target's memory is in NVML's readings now (it is loaded), or it is gone:
        stop reserving it."""
        self._loading.pop(name, None)
