"""The HTTP API, /metrics, the LiteLLM export and the OpenAI-compatible proxy, with the real
llama-server behind them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, free_port, llama_target, wait_for, write_fleet

TOKEN = "t0ken-for-tests"


def request(url: str, token: str | None = None, method: str = "GET",
            body: bytes | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def fleet_with_token(tmp_path, model, llama_server_bin, monkeypatch):
    monkeypatch.setenv("SF_API_TOKEN", TOKEN)
    return write_fleet(tmp_path, {"alpha": llama_target(model, llama_server_bin),
                                  "beta": llama_target(model, llama_server_bin,
                                                       speculation={"method": "ngram"})},
                       api_token={"env": "SF_API_TOKEN"})


def addresses(fleet) -> tuple[str, str]:
    daemon = yaml.safe_load(fleet.read_text())["daemon"]
    return f"http://{daemon['api']}", f"http://{daemon['proxy']['listen']}"


def test_api_endpoints_auth_errors_and_metrics(fleet_with_token, start_daemon):
    api, _ = addresses(fleet_with_token)
    daemon = start_daemon(fleet_with_token)
    daemon.wait_state("alpha", "ready")
    daemon.wait_state("beta", "ready")

    status, body = request(f"{api}/healthz")  # open: never needs the token, never a model
    assert status == 200 and json.loads(body)["status"] == "ok"
    for path in ("/v1/targets", "/v1/targets/alpha", "/metrics", "/v1/litellm", "/v1/events"):
        status, body = request(f"{api}{path}")
        assert status == 401 and "token" in json.loads(body)["error"], path
    assert request(f"{api}/v1/targets", "wrong")[0] == 401

    status, body = request(f"{api}/v1/targets", TOKEN)
    targets = {t["name"]: t for t in json.loads(body)["targets"]}
    assert status == 200 and set(targets) == {"alpha", "beta"}
    beta = json.loads(request(f"{api}/v1/targets/beta", TOKEN)[1])
    assert beta["state"] == "ready" and beta["speculation"]["method"] == "ngram"
    assert beta["endpoint"].startswith("http://127.0.0.1:") and beta["model"].endswith(".gguf")

    status, body = request(f"{api}/v1/targets/nope", TOKEN)
    assert status == 404 and "no target 'nope'" in json.loads(body)["error"]
    status, body = request(f"{api}/v1/targets/nope/restart", TOKEN, "POST", b"")
    assert status == 404
    status, body = request(f"{api}/v1/targets/alpha", TOKEN, "POST", b"{")
    assert status == 405 and "error" in json.loads(body)

    status, body = request(f"{api}/metrics", TOKEN)
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    ready = {s.labels["target"]: s.value for s in families["specfleet_target_ready"].samples}
    assert ready == {"alpha": 1.0, "beta": 1.0}
    states = [(s.labels["target"], s.labels["state"]) for s in
              families["specfleet_target_state"].samples if s.value == 1.0]
    assert sorted(states) == [("alpha", "ready"), ("beta", "ready")]
    assert {s.labels["target"] for s in families["specfleet_target_restarts"].samples} == \
        {"alpha", "beta"}
    assert "specfleet_info" in {s.name for f in families.values() for s in f.samples}

    litellm = json.loads(request(f"{api}/v1/litellm", TOKEN)[1])
    assert [m["model_name"] for m in litellm["model_list"]] == ["alpha", "beta"]

    shown = subprocess.run([sys.executable, "-m", "supervisor", "status", str(fleet_with_token),
                            "--json"], capture_output=True, text=True, cwd=REPO, check=False)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["source"].startswith("api http://")


def test_a_bad_reload_through_the_api_changes_nothing(fleet_with_token, start_daemon):
    api, _ = addresses(fleet_with_token)
    daemon = start_daemon(fleet_with_token)
    pid = daemon.wait_state("alpha", "ready")["pid"]
    good = fleet_with_token.read_text()
    fleet_with_token.write_text(good.replace("version: 1", "version: 1\nbogus: 3"))
    status, body = request(f"{api}/v1/reload", TOKEN, "POST", b"")
    assert status == 422
    assert any("bogus" in p for p in json.loads(body)["problems"])
    assert daemon.target("alpha")["pid"] == pid
    fleet_with_token.write_text(good)
    assert json.loads(request(f"{api}/v1/reload", TOKEN, "POST", b"")[1]) == {"reloaded": True}


def test_a_listener_beyond_loopback_without_a_token_is_refused(tmp_path, model, llama_server_bin):
    fleet = write_fleet(tmp_path, {"alpha": llama_target(model, llama_server_bin)},
                        api=f"0.0.0.0:{free_port()}")
    for command in ("check", "run"):
        done = subprocess.run([sys.executable, "-m", "supervisor", command, str(fleet)],
                              capture_output=True, text=True, cwd=REPO, check=False, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "daemon.api: 0.0.0.0:" in done.stderr
        assert "daemon.api_token is not set" in done.stderr and "Traceback" not in done.stderr


async def _sse_deltas(session: aiohttp.ClientSession, url: str, body: dict) -> list[str]:
    async with session.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.read()
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"]
            if choice:
                out.append((choice[0]["delta"].get("content"), choice[0].get("finish_reason")))
    return out


def test_a_streamed_chat_through_the_proxy_is_identical_to_a_direct_one(
        fleet_with_token, start_daemon):
    _, proxy = addresses(fleet_with_token)
    daemon = start_daemon(fleet_with_token)
    direct = daemon.wait_state("alpha", "ready")["endpoint"]
    body = {"model": "alpha", "stream": True, "temperature": 0, "max_tokens": 24, "seed": 1,
            "messages": [{"role": "user", "content": "Count from one to five."}]}

    async def both() -> tuple[list[str], list[str]]:
        async with aiohttp.ClientSession() as s:
            via = await _sse_deltas(s, f"{proxy}/v1/chat/completions", body)
            own = await _sse_deltas(s, f"{direct}/v1/chat/completions", body)
            return via, own

    via, own = asyncio.run(both())
    assert len(via) > 3 and via == own
    status, body_ = request(f"{proxy}/v1/models", TOKEN)
    assert status == 200 and [m["id"] for m in json.loads(body_)["data"]] == ["alpha", "beta"]
    assert request(f"{proxy}/v1/models")[0] == 401  # the proxy needs the token too


def test_requests_wait_through_a_restart_and_all_succeed(fleet_with_token, start_daemon):
    api, proxy = addresses(fleet_with_token)
    daemon = start_daemon(fleet_with_token)
    pid = daemon.wait_state("beta", "ready")["pid"]
    body = {"model": "beta", "prompt": "def add(a, b):\n    return a + b\n", "max_tokens": 8,
            "temperature": 0}

    async def storm() -> list[tuple[int, str]]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            async def one() -> tuple[int, str]:
                async with s.post(f"{proxy}/v1/completions", json=body) as r:
                    data = await r.json()
                    return r.status, data["choices"][0]["text"] if r.status == 200 else str(data)

            first = [asyncio.create_task(one()) for _ in range(10)]
            await asyncio.sleep(0.2)
            async with s.post(f"{api}/v1/targets/beta/restart") as r:
                assert r.status == 202
            second = [asyncio.create_task(one()) for _ in range(10)]
            return await asyncio.gather(*first, *second)

    results = asyncio.run(storm())
    assert [s for s, _ in results] == [200] * 20, results
    assert all(text for _, text in results)
    new = wait_for(lambda: (t := daemon.target("beta")).get("state") == "ready"
                   and t["pid"] != pid and t["pid"], 60, "the restarted server")
    assert new != pid
    requests = json.loads(request(f"{api}/v1/targets/beta", TOKEN)[1])["requests"]
    assert requests["count"] == 20  # the timings llama.cpp returned, counted per target
    assert requests["draft_tokens"] >= requests["accepted_tokens"]


def test_events_stream_state_changes(fleet_with_token, start_daemon):
    api, _ = addresses(fleet_with_token)
    daemon = start_daemon(fleet_with_token)
    daemon.wait_state("alpha", "ready")

    async def watch() -> list[dict]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s, \
                s.get(f"{api}/v1/events") as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            async with s.post(f"{api}/v1/targets/alpha/restart") as restart:
                assert restart.status == 202
            seen = []
            async for line in r.content:
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    seen.append(event)
                    if event.get("target") == "alpha" and event["data"].get("replace") \
                            == "switched":
                        return seen
        return seen

    # The restart starts the new server beside the old one (the proxy is on): each step is
    # an event, and the target's state never changes (docs/tuning.md).
    events = asyncio.run(asyncio.wait_for(watch(), 60))
    alpha = [e for e in events if e["target"] == "alpha"]
    assert [e["data"]["replace"] for e in alpha if e["kind"] == "replace"] == [
        "beside", "switched"]
    assert [e for e in alpha if e["kind"] == "state"] == []


def test_litellm_export_matches_litellms_documented_schema(fleet_with_token):
    done = subprocess.run([sys.executable, "-m", "supervisor", "export", "litellm",
                           str(fleet_with_token)], capture_output=True, text=True, cwd=REPO,
                          check=False)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    _, proxy = addresses(fleet_with_token)
    for entry, name in zip(config["model_list"], ("alpha", "beta"), strict=True):
        # LiteLLM proxy config: model_name + litellm_params{model "<provider>/<model>",
        # api_base, api_key ("os.environ/VAR" reads the variable)}.
        assert entry["model_name"] == name
        assert entry["litellm_params"] == {"model": f"openai/{name}", "api_base": f"{proxy}/v1",
                                           "api_key": "os.environ/SF_API_TOKEN"}
    assert set(config["router_settings"]) >= {"num_retries", "cooldown_time", "allowed_fails"}
    assert config["general_settings"]["background_health_checks"] is False


def test_the_grafana_dashboard_uses_only_metrics_specfleet_exports():
    import re
    from types import SimpleNamespace

    from supervisor.api.promexport import FleetCollector

    status = {"name": "t", "backend": "llamacpp", "state": "ready", "restarts": 0,
              "speculation": {"method": "ngram", "enabled": True, "draft_length": 8},
              "shown": {"acceptance_rate": 0.5, "mean_accepted_length": 2.0,
                        "tokens_per_second": 40.0, "draft_length": 8},
              "resources": {"vram_bytes": 1, "rss_bytes": 2}}
    fake = SimpleNamespace(fleet_file="f.yaml", target_statuses=lambda: [status])
    exported = {s.name for m in FleetCollector(fake).collect() for s in m.samples}
    dashboard = json.loads((REPO / "examples" / "grafana-dashboard.json").read_text())
    used = {name for p in dashboard["panels"] for t in p["targets"]
            for name in re.findall(r"specfleet_\w+", t["expr"])}
    assert used and used <= exported, used - exported


def test_a_configured_token_that_cannot_be_read_stops_the_start_instead_of_opening_the_api(
        tmp_path, model, llama_server_bin, monkeypatch):
    monkeypatch.delenv("SF_MISSING_TOKEN", raising=False)
    fleet = write_fleet(tmp_path, {"alpha": llama_target(model, llama_server_bin)},
                        api_token={"env": "SF_MISSING_TOKEN"})
    done = subprocess.run([sys.executable, "-m", "supervisor", "run", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False, timeout=60)
    assert done.returncode == 2  # a fleet-file error, as `check` reports it
    assert "daemon.api_token.env: environment variable SF_MISSING_TOKEN is not set" in done.stderr
    assert "Traceback" not in done.stderr


# --- issue 12, item 14: restarts by reason, and a dashboard that shows 0 rather than nothing ---

def scrape(statuses: list[dict]) -> dict[tuple[str, tuple], float]:
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from supervisor.api.promexport import registry_for

    fake = SimpleNamespace(fleet_file="f.yaml", target_statuses=lambda: statuses)
    text = generate_latest(registry_for(fake)).decode()  # type: ignore[arg-type]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_restart_is_counted_by_reason_beside_the_restart_policy_gauge():
    status = {"name": "t", "backend": "llamacpp", "state": "ready", "restarts": 1,
              "restarts_by_reason": {"crash": 1, "restart": 2, "retune": 3}}
    samples = scrape([status])

    def by_reason(reason: str) -> float:
        return samples[("specfleet_target_restarts_by_reason_total",
                        (("backend", "llamacpp"), ("reason", reason), ("target", "t")))]

    assert (by_reason("crash"), by_reason("restart"), by_reason("retune")) == (1, 2, 3)
    assert by_reason("hang") == 0  # the usual reasons exist from the start, so increase() works
    assert samples[("specfleet_target_restarts", (("backend", "llamacpp"), ("target", "t")))] == 1


def test_a_target_status_without_restarts_by_reason_exports_zeros():
    samples = scrape([{"name": "t", "backend": "llamacpp", "state": "ready", "restarts": 0}])
    counted = [v for (name, _), v in samples.items()
               if name == "specfleet_target_restarts_by_reason_total"]
    assert counted and set(counted) == {0.0}


def test_the_dashboards_failed_panel_shows_zero_when_every_target_is_healthy():
    dashboard = json.loads((REPO / "examples" / "grafana-dashboard.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"].lower().startswith("failed"))
    (expr,) = [t["expr"] for t in panel["targets"]]
    # A filter such as `== 1` returns no series when nothing failed ("No data" in Grafana);
    # an aggregation over the 0/1 state gauges, with a fallback for no series at all, is 0.
    assert "==" not in expr and expr.replace(" ", "").endswith("orvector(0)"), expr
    assert expr.startswith(("sum(", "count("))


def test_the_dashboard_charts_restarts_by_reason():
    dashboard = json.loads((REPO / "examples" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert any("specfleet_target_restarts_by_reason_total" in e and "reason" in e for e in exprs)


def test_an_api_restart_is_counted_with_reason_restart_and_not_as_a_policy_restart(
        fleet_with_token, start_daemon):
    api, _ = addresses(fleet_with_token)
    daemon = start_daemon(fleet_with_token)
    pid = daemon.wait_state("alpha", "ready")["pid"]
    assert request(f"{api}/v1/targets/alpha/restart", TOKEN, method="POST")[0] == 202
    wait_for(lambda: (t := daemon.target("alpha"))["state"] == "ready" and t["pid"] != pid,
             60, "alpha restarted")
    text = request(f"{api}/metrics", TOKEN)[1].decode()
    samples = {(s.name, s.labels.get("reason")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples
               if s.labels.get("target") == "alpha"}
    assert samples[("specfleet_target_restarts_by_reason_total", "restart")] == 1
    assert samples[("specfleet_target_restarts_by_reason_total", "crash")] == 0
    assert samples[("specfleet_target_restarts", None)] == 0  # the restart policy's own count


def test_the_litellm_export_names_the_ray_nodes_a_target_asks_for(tmp_path):
    fleet = write_fleet(tmp_path, {
        "near": llama_target("/models/m.gguf", "/bin/true"),
        "far": llama_target("/models/m.gguf", "/bin/true", launcher="ray",
                            ray={"nodes": ["worker-b", "worker-a"]})},
        ray={"address": "127.0.0.1:6379"})
    done = subprocess.run([sys.executable, "-m", "supervisor", "export", "litellm", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    info = {m["model_name"]: m["model_info"] for m in yaml.safe_load(done.stdout)["model_list"]}
    assert info["far"]["ray_nodes"] == ["worker-b", "worker-a"]
    assert "ray_nodes" not in info["near"]
