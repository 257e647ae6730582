"""Calibration: what a step costs on this machine, measured at a known acceptance.

A drafted step's cost depends on its draft size and on how much of it was accepted, not
on the text; the text only decides how often each happens. So the cost is measured apart
from any text: the target's runtime is started on a free port (beside a running fleet;
nothing is routed to it) without speculation, then at two draft lengths far apart with
the runtime's synthetic acceptance (llama.cpp's `--spec-synth-rates`: each step accepts
all of its draft with probability `RATE`, none of it otherwise). Every completion is one
interval (the counters of /metrics before and after it); completions accept different
amounts by chance, so the intervals tell a step's fixed part, its drafted tokens and its
accepted tokens apart (tuning/cost.py). The output of a synthetic server is not valid
text: it is never served to anyone.

Used by `specfleet calibrate` and by the daemon before the tuner's first decision
(`Calibrating`): once the target serves and its tuner needs a calibration, the owner starts
one beside the server, where memory holds a second copy (handover.room_beside, the test a
restart beside makes). A calibration that cannot run (no room, a runtime without synthetic
acceptance) is said once in an event; one that fails is tried again after `RETRY_S`. On a
CPU the calibration shares the cores with the serving server, so beside one it gives way:
its server runs at the lowest CPU priority with threads that sleep rather than spin while
they wait (Backend.background_args; a spinning one stalled the serving server), each
completion begins once the serving server (and every other serving server of the fleet on
the same device: neighbours.py) has been quiet for QUIET_S, and one during which any did
work is measured again, up to AGAIN times as many as the cell has completions
(such a step is slow by the share of the cores serving took, not by what it drafted). Work
on the serving server shows in the proxy's requests at once and, for requests sent to the
runtime's port directly, only at the next metrics scrape: one that begins and ends between
scrapes can go unseen. I/O: starts processes, each stopped with its process group when it
ends, fails or the owner stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError
from supervisor.launcher.process import ProcessLauncher
from supervisor.plugin.backend import Backend, LaunchSpec
from supervisor.supervision.probes import until_ready
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.cost import Interval, StepCost, fit
from supervisor.tuning.load import bucket_of

RATE = 0.5
RETRY_S = 3600.0
# How long the daemon waits for a calibration's plain step before its tuner decides from
# serving alone (the calibration goes on and its result is used when it comes).
PATIENCE_S = 300.0
# Beside a serving server: how long it must have been quiet before a completion begins, and
# how many times a cell's completions each may be measured again (after that all are kept).
QUIET_S = 0.5
AGAIN = 3
PROMPT = ("def parse_line(line):\n    key, _, value = line.partition('=')\n    return "
          "key.strip(), value.strip()\n\n# The same function, copied:\n")


@dataclass(frozen=True)
class Calibration:
    """The cost of a step by load bucket (tuning/load.py's labels), and what it rests on."""

    costs: dict[str, StepCost]
    intervals: int
    lengths: tuple[int, ...]  # () where only the plain step was measured

    @property
    def cost(self) -> StepCost:
        """At one request running: what the CLI shows first."""
        return self.costs["1"]

    def to_dict(self) -> dict[str, Any]:
        return {"costs": {b: c.to_dict() for b, c in self.costs.items()},
                "lengths": list(self.lengths), "intervals": self.intervals,
                "shaped": bool(self.lengths)}


def lengths_for(low: int, high: int) -> tuple[int, int]:
    """Two draft lengths far apart within the target's bounds (2 and 16 by default)."""
    return max(2, low), max(max(2, low) + 2, min(high, 16))


# Loads calibrated: one request, and as many as llama-server's default slots (a batch of
# several requests verifies k+1 tokens for each: another shape of cost, not just a scale).
LOADS = (1, 4)


class Calibrator:
    def __init__(self, target: Target, backend_cls: type[Backend], work: Path,
                 progress: Callable[[str], None] = lambda _: None,
                 completions: int = 6, tokens: int = 64,
                 serving: Callable[[], object] | None = None) -> None:
        """`serving`: beside a serving server of the target, a mark of its work (equal
        marks: it did nothing between them); the calibration then gives way to it."""
        # A free port: a running fleet on the target's own port is not disturbed.
        self.target = target.model_copy(update={"port": _free_port(), "host": "127.0.0.1"})
        self.backend = backend_cls(self.target)
        self.work = work
        self.progress = progress
        self.completions = completions
        self.tokens = tokens
        self.serving = serving
        self.remeasured = 0  # completions measured again because the serving server worked

    def supported(self, length: int) -> bool:
        spec = self.backend.launch_spec(length)
        return self.backend.synthetic_acceptance(spec, RATE, length) is not None

    async def run(self, lengths: tuple[int, int],
                  plain_measured: Callable[[Calibration], None] = lambda _: None
                  ) -> Calibration:
        """Off, then each length with synthetic acceptance; the fitted cost. Where the
        runtime cannot force an acceptance (n-gram drafts, vLLM), the plain step alone:
        what a drafted step costs is then learnt from serving. `plain_measured` gets the
        plain step as soon as it is known, before the lengths (a third of the time)."""
        synthetic = self.supported(lengths[0])
        intervals: list[tuple[int, Interval]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            plain = self.backend.launch_spec(None, speculation=False)
            self.progress("calibrating: the target without speculation")
            intervals += await self._cells(http, "off", plain)
            if synthetic:
                plain_measured(self._fitted(intervals, ()))
            for k in lengths if synthetic else ():
                spec = self.backend.synthetic_acceptance(self.backend.launch_spec(k), RATE, k)
                assert spec is not None
                self.progress(f"calibrating: draft length {k}, synthetic acceptance {RATE:g}")
                intervals += await self._cells(http, f"n{k}", spec)
        return self._fitted(intervals, lengths if synthetic else ())

    @staticmethod
    def _fitted(intervals: list[tuple[int, Interval]], lengths: tuple[int, ...]
                ) -> Calibration:
        costs = {}
        for load in LOADS:
            cost = fit([iv for at, iv in intervals if at == load])
            if cost is None or cost.plain <= 0:
                raise SpecfleetError("calibration measured no step: the runtime reported no "
                                     "generated tokens in its counters")
            costs[bucket_of(load)] = cost
        return Calibration(costs, len(intervals), lengths)

    async def _cells(self, http: aiohttp.ClientSession, name: str,
                     spec: LaunchSpec) -> list[tuple[int, Interval]]:
        """Each completion one interval at one request running; then rounds of LOADS[-1]
        completions at once, each round an interval."""
        out = []
        sampling = {"temperature": 0.0, "ignore_eos": True}
        async with self._server(http, name, spec):
            before = await self.backend.read_metrics(http)
            if before is None:
                raise SpecfleetError(f"{self.target.backend} exposes no counters to calibrate "
                                     "from")
            again = AGAIN * self.completions if self.serving is not None else 0
            for load in LOADS:
                wanted = self.completions if load == 1 else self.completions // 2
                while wanted:
                    mark = await self._quiet() if self.serving is not None else None
                    await asyncio.gather(*(self.backend.generate(http, PROMPT, self.tokens,
                                                                 sampling)
                                           for _ in range(load)))
                    after = await self.backend.read_metrics(http)
                    assert after is not None
                    interval = Interval(
                        after.tokens_predicted_seconds - before.tokens_predicted_seconds,
                        after.tokens_predicted - before.tokens_predicted,
                        after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                        after.accepted_tokens - before.accepted_tokens,
                        speculating=name != "off")
                    before = after
                    if self.serving is not None and again and self.serving() != mark:
                        again -= 1
                        self.remeasured += 1
                        continue
                    out.append((load, interval))
                    wanted -= 1
        return out

    async def _quiet(self) -> object:
        """Wait until the serving server has done nothing for QUIET_S (a completion begun
        in a pause of its traffic is less often measured again); its work mark then."""
        assert self.serving is not None
        mark = self.serving()
        while True:
            await asyncio.sleep(QUIET_S)
            now = self.serving()
            if now == mark:
                return now
            mark = now

    @contextlib.asynccontextmanager
    async def _server(self, http: aiohttp.ClientSession, name: str,
                      spec: LaunchSpec) -> AsyncIterator[None]:
        with tempfile.TemporaryDirectory() as state:
            launcher = ProcessLauncher(self.work, Path(state))
            beside = self.serving is not None
            if beside:
                spec = dataclasses.replace(
                    spec, argv=(*spec.argv, *self.backend.background_args))
            proc = await launcher.start(f"calibrate-{self.target.name}-{name}", spec,
                                        background=beside)
            try:
                why = await until_ready(lambda: self.backend.probe(http), self.target.health,
                                        lambda: proc.returncode, poll=0.25)
                if why is not None:
                    raise SpecfleetError(f"the calibration server {why}; its output:\n"
                                         f"{proc.output_tail()}")
                # The first decode after a load pays page faults no later step pays.
                await self.backend.generate(http, "Hello", 8, {"temperature": 0.0})
                yield
            finally:
                await proc.stop(self.target.restart.stop_grace)


class Calibrating:
    def __init__(self, emit: Callable[..., None], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.emit = emit
        self.clock = clock
        self._task: asyncio.Task[None] | None = None
        self._not_before = 0.0
        self._refused = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def maybe_start(self, target: Target, backend: Backend, tuner: AutoTuner, work: Path,
                    room: Callable[[], Awaitable[tuple[bool, str]]],
                    why_not_beside: str | None = None,
                    serving: Callable[[], object] = lambda: None) -> None:
        """Start a calibration if the tuner needs one and none runs or failed lately;
        `why_not_beside`: why no second server of this target may run here (its launcher
        runs one per target, or runs it elsewhere), if so; `serving`: the serving server's
        work mark (Calibrator)."""
        if not tuner.needs_calibration or self.running or self._refused \
                or self.clock() < self._not_before:
            return
        if why_not_beside is not None:
            self._refused = True
            tuner.uncalibrated(f"not calibrating beside the server: {why_not_beside}; run "
                               "`specfleet calibrate` where the runtime runs, or the cost is "
                               "learnt from serving only")
            return
        self._task = asyncio.create_task(
            self._run(target, type(backend), tuner, work, room, serving),
            name=f"calibrate:{target.name}")

    async def _run(self, target: Target, backend_cls: type[Backend], tuner: AutoTuner,
                   work: Path, room: Callable[[], Awaitable[tuple[bool, str]]],
                   serving: Callable[[], object]) -> None:
        fits, why = await room()
        if not fits:
            self._refused = True
            tuner.uncalibrated(f"not calibrating beside the server: {why}; run `specfleet "
                               "calibrate` while the target is stopped, or the cost is learnt "
                               "from serving only")
            return
        length = target.speculation.length
        lengths = lengths_for(length.min, length.max or backend_cls(target).length_ceiling())
        calibrator = Calibrator(target, backend_cls, work, serving=serving)
        synthetic = calibrator.supported(lengths[0])
        what = (f"draft lengths {lengths[0]} and {lengths[1]} at a synthetic acceptance"
                if synthetic else "the plain step (this runtime cannot force an acceptance: "
                "what a drafted step costs is learnt from serving)")
        self.emit("tuning", f"calibrating beside the server: {what} ({why})")
        if not synthetic and tuner.serving_shows_plain_steps:
            # All it could measure, serving measures too: on a busy box it gives way for
            # minutes (never, under traffic that does not pause) while the served steps
            # that drafted nothing say what a plain step costs. Its result still sharpens.
            tuner.uncalibrated("deciding from serving meanwhile: the steps that drafted "
                               "nothing are plain steps")
        plain_in = asyncio.Event()

        def plain_measured(plain: Calibration) -> None:
            plain_in.set()
            tuner.plain_calibrated(plain.to_dict())

        running = asyncio.ensure_future(calibrator.run(lengths, plain_measured))
        try:
            await asyncio.wait([running], timeout=PATIENCE_S)
            if not running.done() and not plain_in.is_set() and tuner.needs_calibration:
                # It gives way to serving: on a host whose cores serving keeps busy it may
                # not get far. Decide from serving meanwhile; its result still comes in.
                tuner.uncalibrated(
                    f"the calibration beside the server has not measured a plain step in "
                    f"{PATIENCE_S / 60:.0f} minutes (it gives way to serving, "
                    f"{calibrator.remeasured} completions measured again so far): deciding "
                    "from serving until it has")
            result = await running
        except SpecfleetError as exc:
            self._not_before = self.clock() + RETRY_S
            self.emit("tuning", f"calibration failed, tried again in {RETRY_S / 60:.0f} "
                      f"minutes: {exc}")
            return
        finally:
            if not running.done():  # this task was cancelled: the server stops with `running`
                if not running.cancelling():  # once only (see cancel())
                    running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
        if calibrator.remeasured:
            self.emit("tuning", f"the calibration measured {calibrator.remeasured} "
                      "completions again: the serving server worked during them")
        tuner.calibrated(result.to_dict())

    def cancel(self) -> None:
        """End a calibration under way now that its target does not serve (unloaded,
        stopping, failed): its server is stopped with its process group as the task ends;
        it starts again once the target serves."""
        # Once only: a second cancel would land inside the server's stop (the task's
        # `finally`) and abandon it between SIGTERM and the wait, leaving the server's
        # process tree running past the daemon (seen with vLLM).
        if self._task is not None and not self._task.done() and not self._task.cancelling():
            self._task.cancel()

    async def stop(self) -> None:
        """Stop a calibration under way and wait until its server has stopped."""
        if self._task is not None and not self._task.done():
            self.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
