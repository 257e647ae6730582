"""The fleet of target supervisors: one per target, in file order; reload; the view the
HTTP side gets (api/fleetview.py's FleetView).

A reload applies a changed fleet file target by target: removed targets stop, changed
ones get their new definition from their owner (a serving one beside its old server where
it may, as a retune: supervision/handover.py), added ones start; a file with any problem is
rejected whole and the running fleet is untouched. Each target keeps one owner for as long
as it is in the file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from supervisor.atomicfile import LOG_ONLY, StateReport
from supervisor.config.loader import load_fleet
from supervisor.config.schema import Fleet, Target
from supervisor.daemon.history import History
from supervisor.daemon.ondemand import OnDemandLoader
from supervisor.errors import FleetFileError, SpecfleetError
from supervisor.events import Event, EventBus
from supervisor.gpu.placement import Placer, held_vram
from supervisor.plugin.launching import Launcher, local_pid
from supervisor.plugin.registry import Registry
from supervisor.registry.modelkits import ModelKits
from supervisor.registry.store import LayerStore
from supervisor.supervision.commands import Command
from supervisor.supervision.owner import TargetSupervisor
from supervisor.supervision.runrecord import RunRecorder
from supervisor.supervision.states import State
from supervisor.tuning.store import TuningStore

Emit = Callable[..., None]  # (kind, reason, detail=None, data=None): a daemon event
HISTORY_PERIOD = 5.0  # seconds: the finest step of a target's history


class FleetSupervisors:
    def __init__(self, fleet_path: Path, fleet: Fleet, registry: Registry,
                 events: EventBus, launcher_for: Callable[[Target], Launcher], placer: Placer,
                 state_dir: Path, emit: Emit, daemon_info: Callable[[], dict[str, Any]],
                 report: StateReport = LOG_ONLY, *,
                 before_apply: Callable[[Fleet, Fleet], Any] | None = None,
                 after_apply: Callable[[Fleet], Any] | None = None,
                 on_owner_error: Callable[[asyncio.Task[None]], None] | None = None) -> None:
        self.fleet_path = fleet_path
        self.fleet = fleet
        self.registry = registry
        self.events = events
        self.launcher_for = launcher_for
        self.placer = placer
        self.emit = emit
        self._daemon_info = daemon_info
        self.tuning_store = TuningStore(state_dir / "tuning.json", report)
        self.records = RunRecorder(state_dir, report)
        self.supervisors: dict[str, TargetSupervisor] = {}
        self.on_demand = OnDemandLoader(lambda: self.supervisors, placer)
        self.histories = History(state_dir / "history", report=report)
        events.subscribe(self.histories.mark)
        # target -> (the counters last put in the history, when)
        self._sampled: dict[str, tuple[object, float]] = {}
        self.http: aiohttp.ClientSession | None = None
        self.kits: ModelKits | None = None  # made with the first target (it needs self.http)
        self._reload_lock = asyncio.Lock()
        # The last reload that was rejected, shown in the daemon block until one succeeds.
        self.rejected_reload: dict[str, Any] | None = None
        self.last_reload: dict[str, Any] | None = None  # the last one applied
        # Called with (old fleet, new fleet) during a reload, before targets change.
        self.before_apply = before_apply
        self.after_apply = after_apply
        self.on_owner_error = on_owner_error  # an owner task that ended with an exception

    def connect(self, http: aiohttp.ClientSession) -> None:
        """The HTTP session every target's probes and reads use (made on the daemon's loop)."""
        self.http = http

    # --- targets ---

    def add(self, target: Target, reason: str = "daemon started") -> None:
        sup = self._create(target, reason, self._starts_unloaded(target))
        self.supervisors[target.name] = sup
        self._start(sup)

    async def discard_left_running(self) -> None:
        """At daemon start, before targets start: what an earlier daemon that was killed
        left running for a target that starts unloaded now (it swaps, so nothing adopts
        it) is stopped, or it would hold its port and memory where the plan sees none."""
        for target in self.fleet.targets.values():
            launcher = self.launcher_for(target)
            said = await launcher.discard(target.name) if launcher.traits.detaches \
                and self._starts_unloaded(target) else ""
            if said:
                self.events.emit(Event(target.name, "adopt", said))

    def _create(self, target: Target, reason: str, unloaded: bool) -> TargetSupervisor:
        assert self.http is not None
        launcher = self.launcher_for(target)
        sup = TargetSupervisor(target, self.registry.backend_for(target), launcher,
                               self.events, self.http, log_file=self._log_file(target),
                               tuning_store=self.tuning_store, placer=self.placer,
                               records=self.records, start_reason=reason, unloaded=unloaded,
                               proxied=self.fleet.daemon.proxy.enabled, kits=self._kits(),
                               neighbours=lambda: self.supervisors.values())
        self.on_demand.attach(sup)
        return sup

    def _log_file(self, target: Target) -> str:
        return str(self.launcher_for(target).log_path(target.name))

    def _kits(self) -> ModelKits:
        """The way to registries and the layer cache, shared by every target."""
        assert self.http is not None
        if self.kits is None:
            settings = self.fleet.daemon.modelkits
            self.kits = ModelKits(LayerStore(self.fleet.daemon.modelkit_cache), self.http,
                                  settings.timeout, settings.max_size, self._kit_layers,
                                  keys=settings.keys, verify=settings.verify)
        return self.kits

    def _kit_layers(self) -> list[str]:
        """The layer digests targets run now: never pruned from the cache."""
        return [d for sup in self.supervisors.values() if sup.kit
                for d in sup.kit.get("layers", {}).values()]

    def _start(self, sup: TargetSupervisor) -> None:
        task = sup.start_owner_task()
        if self.on_owner_error is not None:
            task.add_done_callback(self.on_owner_error)

    def _starts_unloaded(self, target: Target) -> bool:
        """On demand; or a target that swaps and is not among the most that fit at once
        (it loads at its first request, like an on-demand one)."""
        if target.start == "on_demand":
            return True
        plan = self.placer.fleet_plan.plan if self.placer.fleet_plan else None
        return target.swaps and plan is not None and plan.room is not None \
            and target.name not in plan.at_once

    async def stop_all(self, reason: str) -> None:
        self.on_demand.close()
        # Reverse file order: what was listed first (often what others depend on) stops last.
        # Targets that swap are never left running: the next daemon starts them unloaded.
        for sup in reversed(list(self.supervisors.values())):
            if sup.launcher.traits.detaches and not self.fleet.daemon.stop_targets_on_exit \
                    and not sup.target.swaps:
                await sup.detach(f"{reason}; stop_targets_on_exit is false")
            else:
                await sup.shutdown(reason)

    async def plan(self, fleet: Fleet, ours: dict[int, int] | None = None) -> None:
        """The VRAM plan for `fleet` (at start and at each reload)."""
        backends = {n: self.registry.backend_for(t) for n, t in fleet.targets.items()}
        fp = await self.placer.replan(backends, ours)
        if fp.unavailable:
            self.emit("gpu", fp.unavailable)
        elif fp.plan is not None:
            placed = {n: list(a.gpus) for n, a in fp.plan.assignments.items()}
            self.emit("gpu", f"VRAM plan ({fp.source}): {len(placed)} target(s) placed, "
                      f"{len(fp.plan.refused)} refused", data={"placed": placed,
                                                                "refused": fp.plan.refused})
        if fp.host_warning:
            self.emit("gpu", fp.host_warning, data={"level": "warning"})

    # --- reload ---

    async def reload(self, by: str | None = None) -> tuple[bool, list[str]]:
        """Apply a changed fleet file; a bad file changes nothing. (applied, problems) `by`:
        the name of the API key that asked (its events say so)."""
        async with self._reload_lock:  # SIGHUP and the API may ask at the same time
            try:
                loaded = await asyncio.to_thread(load_fleet, self.fleet_path,
                                                 self.registry.check_target, check_host=True,
                                                 waiting=True)
            except FleetFileError as exc:
                return self._rejected(list(exc.problems), by)
            except Exception as exc:  # whatever the file does to the loader, the fleet stays
                return self._rejected([f"{self.fleet_path}: could not be read: {exc!r}"], by)
            self.rejected_reload = None
            await self._apply(loaded.fleet, loaded.waiting, by)
            return True, []

    def _rejected(self, problems: list[str], by: str | None) -> tuple[bool, list[str]]:
        self.rejected_reload = {"time": time.time(), "file": str(self.fleet_path),
                                "problems": problems}
        self.emit("reload", f"reload rejected: {len(problems)} problem(s) in "
                  f"{self.fleet_path}; the running fleet is unchanged" + _asked(by),
                  detail="\n".join(problems), data={"by": by} if by else None)
        return False, problems

    async def _apply(self, new: Fleet, waiting: dict[str, tuple[str, ...]] | None = None,
                     by: str | None = None) -> None:
        old = self.fleet
        old_targets, new_targets = old.targets, new.targets
        removed = [n for n in old_targets if n not in new_targets]
        added = [n for n in new_targets if n not in old_targets]
        changed = [n for n in new_targets if n in old_targets and new_targets[n] != old_targets[n]]
        changed += await self._moved_tags(new, changed)
        # A failed target's message says "fix it, then reload": a reload retries it, whatever
        # was fixed (the model file, the binary, something outside specfleet).
        retried = [n for n, sup in self.supervisors.items()
                   if n in new_targets and n not in changed and sup.state == State.FAILED]
        self.last_reload = {"time": time.time(), "added": added, "removed": removed,
                            "changed": changed, "retried": retried}
        lacking = sorted(waiting or {})
        self.emit("reload", f"reloaded {self.fleet_path}: {len(added)} added, {len(removed)} "
                  f"removed, {len(changed)} changed, {len(retried)} failed retried"
                  + (f"; {', '.join(lacking)} will wait for what this host lacks"
                     if lacking else "") + _asked(by),
                  detail="\n".join(line for n in lacking for line in (waiting or {})[n])
                  or None,
                  data={"added": added, "removed": removed, "changed": changed,
                        "retried": retried, "waiting": lacking, **({"by": by} if by else {})})
        if self.before_apply is not None:
            await self.before_apply(old, new)
        self.fleet = new
        # Plan the new fleet against free memory plus what its own running targets hold.
        await self.plan(new, held_vram(s.resources for s in self.supervisors.values()))
        for name in removed:
            await self.supervisors.pop(name).shutdown("removed from the fleet file")
        for name in changed:
            self._change(self.supervisors[name], new_targets[name])
        for name in added:
            self.add(new_targets[name], f"added to {self.fleet_path} (reload)")
        for name in retried:
            self.supervisors[name].send(Command.RESTART,
                                        f"retrying after a reload of {self.fleet_path}")
        if self.after_apply is not None:
            await self.after_apply(new)
        self._in_file_order()

    async def _moved_tags(self, new: Fleet, changed: list[str]) -> list[str]:
        """Targets whose ModelKit tag names another manifest now than the one they run: a
        change like any other (the new server pulls it, beside the old one where it may)."""
        moved = []
        for name, target in new.targets.items():
            sup, kit = self.supervisors.get(name), target.modelkit
            if name in changed or kit is None or sup is None or not sup.kit or "pull" in sup.kit:
                continue
            try:
                resolved = await self._kits().resolve(kit.ref)
            except SpecfleetError:
                continue  # a registry that answers nonsense: the running digest stays
            if resolved.offline is None and resolved.digest != sup.kit["manifest_digest"]:
                self.events.emit(Event(name, "modelkit", f"{kit.ref} moved: "
                                       f"{sup.kit['manifest_digest']} -> {resolved.digest}; "
                                       "the target restarts with the new one",
                                       data={"old": sup.kit["manifest_digest"],
                                             "new": resolved.digest}))
                moved.append(name)
        return moved

    def _change(self, sup: TargetSupervisor, target: Target) -> None:
        """A changed target: its owner runs the new definition, beside the serving server
        where it may, else in place (supervision/owner.py, `redefine`). Its name stays
        listed under the same owner throughout: the proxy's requests that arrive meanwhile
        wait for it (within `proxy.hold`), never a 404."""
        launcher = self.launcher_for(target)
        definition = sup.define(target, self.registry.backend_for(target), launcher,
                                self._log_file(target))
        sup.redefine(definition, f"changed in {self.fleet_path} (reload)",
                     unloaded=self._starts_unloaded(target))

    def _in_file_order(self) -> None:
        """Keep file order for status and for the stop order."""
        self.supervisors = {n: self.supervisors[n] for n in self.fleet.targets
                            if n in self.supervisors}

    # --- resources, for the monitor ---

    def running_pids(self) -> dict[str, int]:
        out = {}
        for name, sup in self.supervisors.items():
            if sup.process is not None and sup.process.returncode is None \
                    and local_pid(sup.process) > 0:
                out[name] = sup.process.pid
            else:
                sup.seen_using({})
        return out

    def publish_usage(self, name: str, usage: dict[str, Any]) -> None:
        if (sup := self.supervisors.get(name)) is not None:
            sup.seen_using(usage)

    def daemon_info(self) -> dict[str, Any]:
        return {**self._daemon_info(), "last_reload": self.last_reload,
                "rejected_reload": self.rejected_reload}

    def sample_history(self, now: float) -> None:
        """Each target's shown quantities, when its counters were read anew, at most every
        HISTORY_PERIOD seconds (a status snapshot each: with counters read every second,
        sampling each read would cost the daemon more than the rest of its idle work)."""
        for name, sup in self.supervisors.items():
            last = self._sampled.get(name)
            if sup.metrics is None or (last is not None and (
                    sup.metrics is last[0] or now - last[1] < HISTORY_PERIOD)):
                continue
            self._sampled[name] = (sup.metrics, now)
            self.histories.sample(name, sup.status().shown, now)


def _asked(by: str | None) -> str:
    return f" (asked with key {by!r})" if by else ""
