"""What the status page costs the daemon (issue 17): the daemon's own CPU (its process, not
the runtimes) and RSS with the page open in a headless browser and streaming, against
without, in one run.

    .venv/bin/python benchmarks/ui_overhead.py [--phase 30] [--rounds 3]

One `specfleet run` with two llama-server targets (gemma-3-270m, one thread each), one
client sending completions through the proxy the whole time (so that the history, the
activity list and the counters move). Phases alternate: no browser, then Debian's chromium
(driven by Playwright) on a target page (the event stream open, the log tail re-read every
2 s, the page re-rendered on every event) and, halfway, on the fleet page. A restart of the
other target in every phase gives both the same events to handle. Printed: the daemon's
CPU as % of one core and its RSS per phase kind, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serverproc import free_port, http  # noqa: E402
from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"


def wait_ready(api: str, names: list[str], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            status, body = http(f"http://{api}/v1/targets", timeout=5)
            states = {t["name"]: t["state"] for t in json.loads(body)["targets"]}
            if status == 200 and all(states.get(n) == "ready" for n in names):
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.3)
    raise RuntimeError("targets not ready")


def client(proxy: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            http(f"http://{proxy}/v1/completions", {"model": "coder", "prompt": PROMPT,
                                                    "max_tokens": 24, "temperature": 0}, 120)
        except OSError:
            time.sleep(0.2)


def phase(daemon: psutil.Process, api: str, seconds: float, page=None) -> tuple[float, int]:
    """The daemon's CPU (% of one core) and RSS over one phase."""
    before, began = daemon.cpu_times(), time.monotonic()
    if page is not None:
        page.goto(f"http://{api}/ui#/target/coder")
    time.sleep(seconds / 3)
    http(f"http://{api}/v1/targets/chat/restart", {})  # the same events in every phase
    time.sleep(seconds / 3)
    if page is not None:
        page.goto(f"http://{api}/ui#/")
    time.sleep(seconds - (time.monotonic() - began))
    after = daemon.cpu_times()
    cpu = (after.user + after.system - before.user - before.system) / (time.monotonic() - began)
    return 100 * cpu, daemon.memory_info().rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs Debian's chromium: apt-get install chromium")
    binary = str(provision.cached_llama_server() or provision.build_llama_server(progress=print))
    model = str(assemble_example_model(progress=print))
    small = ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"]
    with tempfile.TemporaryDirectory(prefix="ui-overhead-") as tmp:
        work = Path(tmp)
        api, proxy = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        fleet = work / "fleet.yaml"
        fleet.write_text(yaml.safe_dump({"version": 1, "daemon": {
            "state_dir": str(work / "state"), "api": api, "proxy": {"listen": proxy}},
            "targets": {
                "coder": {"model": model, "binary": binary, "port": free_port(), "args": small,
                          "speculation": {"method": "ngram"}, "tuning": {"enabled": False},
                          "health": {"metrics_interval": "2s"}},
                "chat": {"model": model, "binary": binary, "port": free_port(), "args": small,
                         "health": {"metrics_interval": "2s"}}}}, sort_keys=False))
        proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(fleet)], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=(work / "daemon.log").open("wb"))
        stop = threading.Event()
        results: dict[str, list[tuple[float, int]]] = {"without": [], "with": []}
        try:
            wait_ready(api, ["coder", "chat"])
            daemon = psutil.Process(proc.pid)
            threading.Thread(target=client, args=(proxy, stop), daemon=True).start()
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                for _ in range(args.rounds):
                    results["without"].append(phase(daemon, api, args.phase))
                    wait_ready(api, ["chat"])
                    page = browser.new_page()
                    results["with"].append(phase(daemon, api, args.phase, page))
                    page.close()
                    wait_ready(api, ["chat"])
                browser.close()
        finally:
            stop.set()
            proc.terminate()
            proc.wait(60)
    out = {k: {"cpu_percent": [round(c, 2) for c, _ in v],
               "rss_mb": [round(r / 2**20, 1) for _, r in v]} for k, v in results.items()}
    cpu = {k: statistics.median(v["cpu_percent"]) for k, v in out.items()}
    rss = {k: max(v["rss_mb"]) for k, v in out.items()}
    out["summary"] = {"cpu_percent_median": cpu, "rss_mb_max": rss,
                      "cpu_ratio_with_over_without": cpu["with"] / cpu["without"],
                      "rss_ratio_with_over_without": rss["with"] / rss["without"]}
    print(json.dumps(out, indent=1))
    print(f"\ndaemon CPU: {cpu['without']:.2f} % of a core without the page, {cpu['with']:.2f} % "
          f"with it open ({cpu['with'] / cpu['without']:.2f}x); RSS {rss['without']:.1f} MB / "
          f"{rss['with']:.1f} MB ({rss['with'] / rss['without']:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
