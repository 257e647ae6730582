"""The calibration: what a step costs, measured at a synthetic acceptance on a real
llama-server (live), and when the daemon runs it beside a serving server or says why not."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target
from supervisor.plugin.backend import RuntimeInfo
from supervisor.supervision import calibration
from supervisor.supervision.calibration import (
    Calibrating,
    Calibration,
    Calibrator,
    lengths_for,
)
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.cost import StepCost
from tests.conftest import eventually, llama_target, write_fleet

REPO = Path(__file__).resolve().parents[2]


def test_two_lengths_far_apart_within_the_bounds():
    assert lengths_for(1, 16) == (2, 16)
    assert lengths_for(1, 64) == (2, 16)
    assert lengths_for(4, 8) == (4, 8)
    assert lengths_for(1, 3) == (2, 4)  # two sizes apart at least, even past a low max


def test_llama_cpp_forces_an_acceptance_for_draft_models_but_not_for_ngram(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    draft = Target(name="d", model=str(model), port=1,
                   speculation={"method": "draft", "draft": str(model)})
    backend = LlamaCppBackend(draft)
    spec = backend.synthetic_acceptance(backend.launch_spec(4), 0.5, 4)
    assert spec is not None and spec.argv[-2:] == ("--spec-synth-rates", "0.5,0.5,0.5,0.5")
    ngram = Target(name="n", model=str(model), port=1, speculation={"method": "ngram"})
    assert LlamaCppBackend(ngram).synthetic_acceptance(
        LlamaCppBackend(ngram).launch_spec(4), 0.5, 4) is None


def draft_tuner(tmp_path: Path) -> tuple[Target, AutoTuner, list[str]]:
    """A draft-model target's tuner, its runtime started, and the reasons it says."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    target = Target(name="t", model=str(model), port=1,
                    speculation={"method": "draft", "draft": str(model)})
    events: list[str] = []
    tuner = AutoTuner(target, LlamaCppBackend(target), None,
                      lambda kind, reason, **data: events.append(reason))
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    return target, tuner, events


async def test_a_launcher_that_runs_one_server_per_target_is_not_calibrated_beside(tmp_path):
    target, tuner, events = draft_tuner(tmp_path)
    calibrating = Calibrating(lambda *a, **k: None)

    async def room() -> tuple[bool, str]:
        raise AssertionError("not asked: no second server can run")

    calibrating.maybe_start(target, tuner.backend, tuner, tmp_path, room,
                            "the systemd launcher runs one server of a target")
    assert not calibrating.running and not tuner.needs_calibration
    assert "systemd launcher runs one server" in events[-1]
    assert "specfleet calibrate" in events[-1]


async def test_no_room_beside_is_said_once_and_the_tuner_decides_without(tmp_path):
    target, tuner, events = draft_tuner(tmp_path)
    calibrating = Calibrating(lambda *a, **k: None)

    async def no_room() -> tuple[bool, str]:
        return False, "a second server needs about 9.0 GiB of host memory, 2.0 GiB is available"

    for _ in range(3):
        calibrating.maybe_start(target, tuner.backend, tuner, tmp_path, no_room)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert sum("9.0 GiB" in e for e in events) == 1 and not tuner.needs_calibration


def test_specfleet_calibrate_measures_a_real_server_and_keeps_the_cost(
        tmp_path, model, llama_server_bin):
    # The packaged model as its own draft: its drafted step costs a draft decode per token.
    target = llama_target(model, llama_server_bin, speculation={
        "method": "draft", "draft": model, "length": {"start": 4, "min": 1, "max": 8}})
    fleet = write_fleet(tmp_path, {"self": target})
    before = {p.pid for p in psutil.process_iter()}
    run = subprocess.run([sys.executable, "-m", "supervisor", "calibrate", str(fleet),
                          "--target", "self", "--completions", "4", "--tokens", "32"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "1 running: a plain step" in run.stdout and "4-7 running: a plain step" in run.stdout
    kept = json.loads((tmp_path / "state" / "tuning.json").read_text())["self"]
    one = kept["calibration"]["costs"]["1"]
    assert kept["calibration"]["lengths"] == [2, 8] and kept["calibration"]["shaped"]
    assert one["plain"] > 0 and one["per_draft"] > 0
    # A drafted step of 8 (each token a decode of the same model) costs more than one of 2.
    assert one["step"] + 8 * one["per_draft"] > one["step"] + 2 * one["per_draft"]
    assert kept["runtime_key"]
    # Nothing it started is left.
    left = [p for p in psutil.process_iter(["cmdline"])
            if p.pid not in before and llama_server_bin in " ".join(p.info["cmdline"] or [])]
    assert left == []


async def test_a_calibration_cancelled_then_stopped_finishes_stopping_its_server():
    # The owner cancels a calibration when its target stops serving, then awaits its stop
    # as the daemon ends: the second call must wait for the server's stop, not cut it.
    calibrating = Calibrating(lambda *a, **k: None)
    stopped = asyncio.Event()

    async def calibration() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # SIGTERM sent, waiting for the server to exit
            stopped.set()

    calibrating._task = asyncio.create_task(calibration())
    await asyncio.sleep(0)
    calibrating.cancel()
    await asyncio.sleep(0.05)
    await calibrating.stop()
    assert stopped.is_set()


async def test_a_calibration_that_gives_way_too_long_lets_the_tuner_decide_meanwhile(
        tmp_path, monkeypatch):
    target, tuner, events = draft_tuner(tmp_path)
    finish = asyncio.Event()

    async def slow_run(self, lengths, plain_measured):  # the serving server keeps the cores
        await finish.wait()
        return Calibration({"1": StepCost(0.04, 0.05, 0.01, 0.0)}, 18, lengths)

    async def room() -> tuple[bool, str]:
        return True, "room"

    monkeypatch.setattr(Calibrator, "run", slow_run)
    monkeypatch.setattr(calibration, "PATIENCE_S", 0.05)
    calibrating = Calibrating(lambda *a, **k: None)
    calibrating.maybe_start(target, tuner.backend, tuner, tmp_path, room)
    await eventually(lambda: events and "has not measured a plain step" in events[-1],
                     what="the tuner told to decide meanwhile")
    assert not tuner.needs_calibration
    assert calibrating.running  # it goes on: its result is still wanted
    finish.set()
    await eventually(lambda: not calibrating.running, what="the calibration's end")
    assert events[-1].startswith("calibrated: a plain step 40")
    assert tuner.memory.calibration is not None


async def test_an_ngram_tuner_decides_from_serving_at_once_while_its_calibration_runs(
        tmp_path, monkeypatch):
    # Its calibration can measure only the plain step, which serving shows too (the steps
    # that matched nothing): on a box whose traffic never pauses it would wait for minutes.
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    target = Target(name="n", model=str(model), port=1, speculation={"method": "ngram"},
                    tuning={"enabled": True})
    events: list[str] = []
    tuner = AutoTuner(target, LlamaCppBackend(target), None,
                      lambda kind, reason, **data: events.append(reason))
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert tuner.needs_calibration and not tuner.may_decide
    finish = asyncio.Event()

    async def slow_run(self, lengths, plain_measured):
        await finish.wait()
        return Calibration({"1": StepCost(0.04, 0.0, 0.0, 0.0)}, 9, ())

    async def room() -> tuple[bool, str]:
        return True, "room"

    monkeypatch.setattr(Calibrator, "run", slow_run)
    monkeypatch.setattr(calibration, "PATIENCE_S", 0.05)
    calibrating = Calibrating(lambda kind, reason, **data: events.append(reason))
    calibrating.maybe_start(target, tuner.backend, tuner, tmp_path, room)
    await eventually(lambda: events and "deciding from serving meanwhile" in events[-1],
                     what="the tuner told to decide from serving")
    assert tuner.may_decide and calibrating.running
    assert not any("has not measured a plain step" in e for e in events)  # said once
    finish.set()
    await eventually(lambda: not calibrating.running, what="the calibration's end")
    assert events[-1].startswith("calibrated: a plain step 40") and tuner.memory.calibration
    # A draft model's served steps all draft: it still waits for the plain step.
    target, tuner, events = draft_tuner(tmp_path)
    assert not tuner.serving_shows_plain_steps and not tuner.may_decide


@pytest.mark.parametrize("patience", [3600, 0.05])
async def test_a_calibration_stopped_while_it_runs_stops_its_server_first(
        tmp_path, monkeypatch, patience):
    # Stopped while the owner waits for its plain step, and after it gave up waiting.
    target, tuner, _ = draft_tuner(tmp_path)
    stopped = asyncio.Event()

    async def run(self, lengths, plain_measured):
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # SIGTERM sent, waiting for the server to exit
            stopped.set()

    async def room() -> tuple[bool, str]:
        return True, "room"

    monkeypatch.setattr(Calibrator, "run", run)
    monkeypatch.setattr(calibration, "PATIENCE_S", patience)
    calibrating = Calibrating(lambda *a, **k: None)
    calibrating.maybe_start(target, tuner.backend, tuner, tmp_path, room)
    await asyncio.sleep(0.1)
    await calibrating.stop()
    assert stopped.is_set() and not calibrating.running


async def test_beside_a_serving_server_the_calibration_gives_way_and_measures_again(
        tmp_path, model, llama_server_bin):
    # n-gram: the plain step only, one calibration server. The serving server works during
    # the first two completions (its mark moves as they run), never between them.
    target = Target.model_validate({**llama_target(model, llama_server_bin), "name": "t",
                                    "speculation": {"method": "ngram"}})
    servers: dict[int, tuple[list[str], int]] = {}
    work = [0]

    def serving() -> object:
        for p in psutil.Process().children():  # the calibration's server, while it runs
            if llama_server_bin in " ".join(p.cmdline()):
                servers[p.pid] = (p.cmdline(), p.nice())
        return work[0]

    calibrator = Calibrator(target, LlamaCppBackend, tmp_path, completions=2, tokens=8,
                            serving=serving)
    generate = calibrator.backend.generate
    completions = [0]

    async def generate_while_serving_works(http, prompt, *args, **kwargs):
        if prompt == calibration.PROMPT:  # not the warm-up after the load
            completions[0] += 1
            if completions[0] <= 2:
                work[0] += 1
        return await generate(http, prompt, *args, **kwargs)

    calibrator.backend.generate = generate_while_serving_works  # type: ignore[method-assign]
    result = await calibrator.run((2, 16))
    assert calibrator.remeasured == 2
    assert result.intervals == 3  # two at one request, one round at four: as if alone
    assert result.costs["1"].plain > 0
    ((argv, nice),) = servers.values()
    # At the lowest priority, its threads sleeping while they wait (the last --poll wins).
    assert argv[-2:] == ["--poll", "0"] and nice == 19
