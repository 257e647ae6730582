"""What comes before a target's process starts, in order: where the runtime's commands run
(an image?), what the host lacks for it (files, binary), the runtime's preflight, the
pairing guard, the VRAM placement, the tuner's view of the runtime, and the launch spec with
the tuner's setting. Raises what makes the start impossible (StartRefused, SpecfleetError),
which the owner turns into a failure, or what the host lacks now (Lacking, NotReachableYet),
which it waits for (waiting.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.errors import Lacking, StartRefused
from supervisor.gpu.placement import Placer
from supervisor.plugin.backend import Backend, Failure, FailureKind, LaunchSpec
from supervisor.plugin.launching import Launcher, RunningProcess
from supervisor.supervision.explain import pairing_warnings
from supervisor.supervision.server import Definition, Server
from supervisor.supervision.waiting import lacking
from supervisor.tuning.autotuner import AutoTuner


@dataclass(frozen=True)
class StartPlan:
    spec: LaunchSpec
    runtime: dict[str, str]  # binary, version and where it runs: the status's `runtime`
    placement: dict[str, Any]  # the GPUs and memory share the VRAM plan gave it


async def plan_start(name: str, backend: Backend, launcher: Launcher, placer: Placer | None,
                     tuner: AutoTuner, pairing: Callable[[list[str]], None]) -> StartPlan:
    """`pairing` gets the pairing guard's warnings (cached per file: cheap after the first)."""
    backend.runs_on(await launcher.runtime_host(name))
    # Before the runtime loads half a model and crashes on it, or cannot be found at all.
    if (why := await asyncio.to_thread(lacking, backend)) is not None:
        raise Lacking(why)
    info = await backend.preflight()
    pairing(await pairing_warnings(backend))
    assignment = await placer.check_start(name) if placer else None
    tuner.runtime_started(info)
    spec = tuner.launch_backend(backend).launch_spec(
        tuner.draft_length, speculation=tuner.speculation_on, placement=assignment)
    return StartPlan(spec, {"binary": info.binary, "version": info.version,
                            **backend.executor.facts},
                     {"gpus": list(assignment.gpus), "per_gpu": assignment.per_gpu,
                      "memory_fraction": assignment.memory_fraction} if assignment else {})


async def launch(name: str, backend: Backend, definition: Definition, placer: Placer | None,
                 pairing: Callable[[list[str]], None],
                 may_adopt: bool = False) -> tuple[Server, str]:
    """A server of `definition` listening as `backend` says: the one the previous daemon
    left running where `may_adopt` and the launcher finds it (a unit), else started; and
    why none was adopted ("" when none was looked for)."""
    plan = await plan_start(name, backend, definition.launcher, placer, definition.tuner,
                            pairing)
    launcher, grace = definition.launcher, definition.target.restart.stop_grace
    adopted, why = (await launcher.adopt(name, plan.spec, stop_grace=grace)
                    if may_adopt else (None, ""))
    proc = adopted if adopted is not None else await launcher.start(
        name, plan.spec, stop_grace=grace, on_line=backend.on_output)
    return Server(proc, backend, plan.spec, plan.runtime, follow(proc, backend, plan.placement),
                  adopted=adopted is not None), why


def start_failure(name: str, exc: Exception) -> Failure:
    """A start that cannot succeed, as a final failure: refused by the placer, a check of
    the backend, or the operating system (a binary that cannot be executed). (What the host
    lacks, a cluster or registry that does not answer, is waited for: never here.)"""
    if isinstance(exc, StartRefused):
        return Failure(FailureKind.REFUSED, str(exc), retryable=False)
    if isinstance(exc, OSError):
        return Failure(FailureKind.CRASH, f"could not start target '{name}': "
                       f"{exc.strerror or exc}", retryable=False)
    return Failure(FailureKind.BAD_ARGUMENTS, str(exc), retryable=False)


def follow(proc: RunningProcess, backend: Backend, placement: dict[str, Any]) -> dict[str, Any]:
    """Probes, counters, the proxy and the run record follow the process to its node: the
    backend's address, and the placement with the node in it."""
    where = dict(proc.location)
    backend.at_node(where.get("address"))
    return {**{k: v for k, v in placement.items()
               if k not in ("node", "node_id", "address", "node_gpus")}, **where}
