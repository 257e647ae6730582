"""The quick start without a terminal (CI, a pipe, nohup): run the fleet until every
target has answered a completion through the proxy, show `specfleet status`, then stop it.

On a terminal, scripts/quickstart.sh runs the fleet in the foreground instead, until
Ctrl-C. Without one, nobody would ever press Ctrl-C, so this proves the same set-up and
ends: exit 0 when every target answered, 1 (with the daemon's own output) otherwise.
The daemon stops its targets on SIGTERM, so nothing is left running either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from supervisor.config.loader import load_fleet

REPO = Path(__file__).resolve().parent.parent
SPECFLEET = REPO / ".venv" / "bin" / "specfleet"
READY_WITHIN = 300.0  # seconds; a 2-core machine loads each gemma server in a few


def get_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def states(api: str) -> dict[str, str]:
    try:
        listed = get_json(f"http://{api}/v1/targets")
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    return {t["name"]: t["state"] for t in listed["targets"]}


def wait_ready(daemon: subprocess.Popen[bytes], api: str, names: list[str]) -> bool:
    deadline = time.monotonic() + READY_WITHIN
    seen: dict[str, str] = {}
    while time.monotonic() < deadline and daemon.poll() is None:
        now = states(api)
        if now != seen:
            print("  " + ", ".join(f"{n}: {s}" for n, s in sorted(now.items())), flush=True)
            seen = now
        if now and all(now.get(n) == "ready" for n in names):
            return True
        time.sleep(0.5)
    return False


def main(fleet_file: str) -> int:
    fleet = load_fleet(fleet_file).fleet
    names = list(fleet.targets)
    api, proxy = fleet.daemon.api, fleet.daemon.proxy.listen
    print(f"no terminal: running {fleet_file} until {', '.join(names)} answer, then stopping it",
          flush=True)
    with tempfile.TemporaryFile() as out:
        daemon = subprocess.Popen([str(SPECFLEET), "run", fleet_file], stdout=out,
                                  stderr=subprocess.STDOUT)
        try:
            answered = wait_ready(daemon, api, names) and all(complete(proxy, n) for n in names)
            subprocess.run([str(SPECFLEET), "status", fleet_file], check=False)
        finally:
            daemon.terminate()
            daemon.wait(120)
        if not answered:
            out.seek(0)
            print(f"the quick-start fleet did not come up; the daemon said:\n"
                  f"{out.read().decode(errors='replace')[-4000:]}", file=sys.stderr)
            return 1
    print("quick start: every target answered through the proxy; fleet stopped", flush=True)
    return 0


def complete(proxy: str, name: str) -> bool:
    """One completion through the proxy, as a router would send it; its text shown."""
    try:
        reply = get_json(f"http://{proxy}/v1/completions", {
            "model": name, "max_tokens": 24, "temperature": 0,
            "prompt": "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n"})
        text, tokens = reply["choices"][0]["text"], reply["usage"]["completion_tokens"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        print(f"  {name} did not answer through the proxy: {exc}", flush=True)
        return False
    print(f"  {name} answered: {text!r}", flush=True)
    return bool(tokens)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "examples/quickstart.yaml"))
