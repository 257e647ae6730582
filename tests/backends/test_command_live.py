"""`backend: command` (docs/command.md) against real OpenAI-compatible servers that are not
built-in backends:

- llama-server in router mode (`--models-dir`): one process that loads each model in a child
  llama-server of its own when a request names it. On demand beside a llama.cpp target,
  with the GPU memory declared so that only one of them fits: they swap, every request is
  answered, and neither the router nor the child it started outlives its unload or a kill.
- LiteLLM's proxy (PyPI `litellm[proxy]`, in a venv of its own in the cache) in front of a
  llama.cpp target of the same fleet: the proxy routes to it by its served model name, its
  counters are none (status shows nothing to tune), kill -9 restarts it; LiteLLM starts only
  with a master key, which the target's `api_key` gives it through `options.key_env`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.conftest import (
    FAST_HEALTH,
    FAST_RESTART,
    SMALL_SERVER_ARGS,
    free_port,
    llama_target,
    wait_for,
    write_fleet,
)
from tests.daemon.test_on_demand_live import complete, fleet_of, loaded, unload_reasons


def command_target(command: list[str], model: str, **over: Any) -> dict[str, Any]:
    options = {"command": command, **over.pop("options", {})}
    return {"backend": "command", "model": model, "port": free_port(),
            "speculation": {"method": "none"}, "health": dict(FAST_HEALTH),
            "restart": dict(FAST_RESTART), "options": options, **over}


def processes_under(path: Path) -> dict[int, str]:
    """Processes whose command line names `path` (the test's own folder), but this one."""
    out = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(path) in cmd and proc.info["pid"] != os.getpid():
            out[proc.info["pid"]] = cmd
    return out


def test_a_llama_server_router_swaps_on_demand_with_a_llamacpp_target(
        tmp_path, model, llama_server_bin, start_daemon):
    models = tmp_path / "router-models"
    models.mkdir()
    (models / "gemma.gguf").symlink_to(Path(model).resolve())
    fleet = fleet_of(tmp_path, {
        "plain": llama_target(model, llama_server_bin, start="on_demand", min_residency="1s"),
        "router": command_target(
            [llama_server_bin, "--models-dir", "{model}", "--models-max", "1",
             "--host", "{host}", "--port", "{port}", *SMALL_SERVER_ARGS], str(models),
            start="on_demand", min_residency="1s",
            options={"served_model": "gemma", "memory": 0})}, fit=1)
    doc = yaml.safe_load(fleet.read_text())  # the router holds what the llama.cpp target does
    doc["targets"]["router"]["options"]["memory"] = doc["daemon"]["gpu"]["memory"][0] * 2 // 3
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon = start_daemon(fleet)
    for name in ("plain", "router"):
        daemon.wait_state(name, "unloaded", 30)

    assert complete(fleet, "router")  # the router starts, then loads gemma in a child
    router = daemon.target("router")
    children = psutil.Process(router["pid"]).children(recursive=True)
    assert children and all(models.name in " ".join(c.cmdline()) for c in children), children
    assert router["backend"] == "command"

    assert complete(fleet, "plain")
    assert loaded(daemon) == {"plain"}
    [evicted] = unload_reasons(daemon, "router")
    assert evicted.startswith("evicted to load plain (")
    wait_for(lambda: not any(models.name in c for c in processes_under(tmp_path).values()),
             30, "the router and its child gone")

    assert complete(fleet, "router", stream=True)
    assert loaded(daemon) == {"router"}
    assert unload_reasons(daemon, "plain")[-1].startswith("evicted to load router (")

    # kill -9 of the router: its group goes with it (the child holding the model too), and
    # the target starts again by itself.
    router = daemon.target("router")
    child_pids = [c.pid for c in psutil.Process(router["pid"]).children(recursive=True)]
    os.kill(router["pid"], signal.SIGKILL)
    wait_for(lambda: daemon.target("router").get("pid") not in (None, router["pid"])
             and daemon.target("router").get("state") == "ready", 60, "the router restarted")
    assert not [p for p in child_pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert complete(fleet, "router")
    assert daemon.target("router")["restarts"] == 1


def chat(fleet: Path, model: str, stream: bool = False) -> str:
    """A chat completion through specfleet's proxy: the answer's text (streamed: every
    chunk's, after checking that the stream ended with [DONE])."""
    body = {"model": model, "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 16, "temperature": 0, "stream": stream}
    proxy = "http://" + yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    req = urllib.request.Request(f"{proxy}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        raw = resp.read().decode()
    if not stream:
        return str(json.loads(raw)["choices"][0]["message"]["content"])
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", raw[-300:]
    return "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e)["choices"])


def litellm_config(path: Path, upstream_port: int) -> Path:
    path.write_text(yaml.safe_dump({"model_list": [{
        "model_name": "chat",
        "litellm_params": {"model": "openai/gemma", "api_base":
                           f"http://127.0.0.1:{upstream_port}/v1", "api_key": "none"}}]}))
    return path


def test_litellms_proxy_in_front_of_a_llamacpp_target_serves_and_restarts(
        tmp_path, model, llama_server_bin, litellm_bin, start_daemon):
    upstream = llama_target(model, llama_server_bin)
    config = litellm_config(tmp_path / "litellm.yaml", upstream["port"])
    key = tmp_path / "litellm.key"  # LiteLLM starts only with a master key
    key.write_text("sk-" + secrets.token_hex(32))
    gateway = command_target([litellm_bin, "--config", "{model}", "--host", "{host}",
                              "--port", "{port}", "--num_workers", "1"], str(config),
                             api_key={"file": str(key)},
                             options={"served_model": "chat", "key_env": "LITELLM_MASTER_KEY",
                                      "health": {"path": "/health/liveliness"}})
    gateway["health"]["start_timeout"] = "180s"  # LiteLLM imports for a while on 2 cores
    fleet = write_fleet(tmp_path, {"llm": upstream, "gateway": gateway})
    daemon = start_daemon(fleet)
    daemon.wait_state("llm", "ready", 60)
    first = daemon.wait_state("gateway", "ready", 240)
    # No counters named, no {draft_length}: nothing to read or tune, and status says so.
    assert first["speculation"]["tunable"] is None and first["metrics"] == {}
    text = chat(fleet, "gateway")
    assert text and text == chat(fleet, "llm")  # temperature 0: the same server answers
    assert chat(fleet, "gateway", stream=True) == text

    os.kill(first["pid"], signal.SIGKILL)
    again = wait_for(lambda: (t := daemon.target("gateway")).get("state") == "ready"
                     and t.get("pid") != first["pid"] and t, 300, "LiteLLM started again")
    assert again["restarts"] == 1
    assert chat(fleet, "gateway") == text
    assert daemon.target("llm")["restarts"] == 0
