"""What the tuner's calibration beside a serving server costs that server, and what it
measures meanwhile: spinning (llama.cpp's defaults) against giving way (the daemon's way:
supervision/calibration.py, Backend.background_args, ProcessLauncher's `background`).

One llama-server of the packaged model serves 64-token completions from one client; beside
it the product's Calibrator measures the plain step of the same model (an n-gram target: no
synthetic acceptance, so one calibration server; `--completions` at one request and half as
many rounds at four). Each round, in this order:
- `alone`: the serving server with nothing beside it (the serving baseline);
- `calibration alone`: the calibration with no serving traffic (the plain-step baseline);
- then, with the client's requests back to back and then 3 s apart (`--gaps 0,3`):
  `spinning`: both at once, the calibration server at normal priority with ggml's polling
  threads, its completions all kept; `giving way`: both at once, as the daemon runs it
  (lowest priority, --poll 0, the completions during which the serving server worked
  measured again).
Printed, as ratios to the same round's `alone` ones: the tokens/s the serving server served
over the window (all its tokens over the seconds until the calibration ended; with back-to-
back requests only), its requests' own tokens/s, and the calibration's plain step. A mode
that has not finished in `--limit` seconds is cut and said so.

    .venv/bin/python benchmarks/calibration_beside.py --rounds 1 --limit 180
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from plugins.llamacpp import provision  # noqa: E402
from plugins.llamacpp.backend import LlamaCppBackend  # noqa: E402
from supervisor.config.schema import Target  # noqa: E402
from supervisor.plugin import example_model_path  # noqa: E402
from supervisor.supervision.calibration import Calibrator  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from serverproc import Server, free_port, http  # noqa: E402

TOKENS = 64
PROMPT = "The history of the Roman Empire begins with"


class Serving:
    """One client sending completions back to back; its tokens/s and a work mark."""

    def __init__(self, base: str, gap: float = 0.0) -> None:
        self.base = base
        self.gap = gap  # seconds between a response and the next request
        self.speeds: list[float] = []
        self.sent = 0
        self.busy = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.busy, self.sent = True, self.sent + 1
            began = time.monotonic()
            status, _ = http(f"{self.base}/completion", {
                "prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "ignore_eos": True})
            if status == 200:
                self.speeds.append(TOKENS / (time.monotonic() - began))
            self.busy = False
            self._stop.wait(self.gap)

    def mark(self) -> object:
        # As the daemon's (neighbours.work_mark): never equal while a request runs.
        return object() if self.busy else self.sent

    def __enter__(self) -> Serving:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = time.monotonic() - self.began  # the window: until the calibration ended
        self.served = list(self.speeds)
        self._stop.set()
        self._thread.join(900)

    def result(self) -> dict[str, Any]:
        """Tokens served over the window's seconds (a request still running at its end
        counts nothing), and the mean of the window's requests' own rates."""
        return {"tokens_per_s": len(self.served) * TOKENS / self.seconds,
                "request_tokens_per_s": mean(self.served), "requests": len(self.served)}


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


async def calibrate(target: Target, work: Path, completions: int, limit: float,
                    serving: Serving | None) -> dict[str, Any]:
    cal = Calibrator(target, LlamaCppBackend, work, completions=completions, tokens=TOKENS,
                     serving=serving.mark if serving is not None else None)
    began = time.monotonic()
    try:
        result = await asyncio.wait_for(cal.run((2, 16)), limit)
    except TimeoutError:
        return {"finished": False, "seconds": limit, "remeasured": cal.remeasured}
    return {"finished": True, "seconds": time.monotonic() - began,
            "plain_ms": result.costs["1"].plain * 1000, "remeasured": cal.remeasured}


def one_round(binary: str, model: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    server = Server([binary, "--model", model, "--port", str(port), "--ctx-size", "4096",
                     "--parallel", "1"], {}, port, work / "serving.log")
    out: dict[str, Any] = {}
    try:
        server.wait_ready(120)
        http(f"{server.base}/completion", {"prompt": "Hello", "n_predict": 8})
        target = Target(name="cal", model=model, binary=binary, port=1,
                        speculation={"method": "ngram"})
        with Serving(server.base) as alone:
            time.sleep(args.alone_s)
        out["alone"] = alone.result()
        out["calibration alone"] = asyncio.run(
            calibrate(target, work, args.completions, args.limit, None))
        for gap in args.gaps:
            for mode in ("spinning", "giving way"):
                # Spinning: the calibration as if it were alone (no mark: no give way).
                with Serving(server.base, gap) as serving:
                    time.sleep(2)
                    cal = asyncio.run(calibrate(target, work, args.completions, args.limit,
                                                serving if mode == "giving way" else None))
                out[f"{mode}, gap {gap:g} s"] = {**cal, **serving.result()}
    finally:
        server.stop()
    return out


def report(rounds: list[dict[str, Any]]) -> list[str]:
    lines = ["| round | mode | served tokens/s vs alone | a request's tokens/s vs alone "
             "| calibration plain step vs alone | calibration time | measured again |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        base, plain = r["alone"], r["calibration alone"].get("plain_ms")
        for mode in [k for k in r if k.startswith(("spinning", "giving way"))]:
            m = r[mode]
            # With gaps the client asks for less than alone: only its requests' own speed
            # compares.
            served = (f"{m['tokens_per_s'] / base['tokens_per_s']:.2f}×"
                      if mode.endswith("gap 0 s") else "-")
            speed = (f"{m['request_tokens_per_s'] / base['request_tokens_per_s']:.2f}×"
                     if m["request_tokens_per_s"] else "none finished")
            step = (f"{m['plain_ms'] / plain:.2f}×" if m.get("plain_ms") and plain
                    else "not finished")
            time_s = f"{m['seconds']:.0f} s" + ("" if m["finished"] else " (cut)")
            lines.append(f"| {i} | {mode} | {served} | {speed} | {step} | {time_s} "
                         f"| {m['remeasured']} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument("--alone-s", type=float, default=20.0)
    parser.add_argument("--gaps", type=lambda v: [float(g) for g in v.split(",")],
                        default=[0.0, 3.0],
                        help="seconds between the serving client's requests, one pair of "
                        "modes for each (default 0,3)")
    parser.add_argument("--limit", type=float, default=300.0,
                        help="seconds a calibration may take before it is cut")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "calibration_beside.json",
                        help="where the rounds are saved (the runs in benchmarks/README.md "
                        "are calibration_beside-runN.json)")
    args = parser.parse_args()
    binary, model = str(provision.cached_llama_server()), str(example_model_path())
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            work = Path(tmp) / f"r{i}"
            work.mkdir()
            shown = len(report(rounds))
            rounds.append(one_round(binary, model, work, args))
            print("\n".join(report(rounds)[shown:]), flush=True)
    args.out.write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds}, indent=1))
    print("\n".join(report(rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
