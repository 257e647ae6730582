"""Keys with scopes (issue 48): a read key for monitoring, an inference key for a router (one
target, or all), an admin key, and the old api_token as every scope; each re-read at every
use, its name (never the key) in the request log and in the events of what it did; refusals
401 or 403 naming the missing scope, on the API, the proxy and the status page. Against a
daemon with real llama-servers; Debian's Prometheus scrapes /metrics with the read key."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api.test_ui_api import Client
from tests.conftest import REPO, free_port, llama_target, wait_for, write_fleet

SECRETS = {"token": "all-0f-them", "prom": "read-0nly", "router": "inference-all",
           "editor": "inference-alpha", "ops": "admin-key"}


def keyed_fleet(tmp_path: Path, model: str, binary: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("token", "prom", "ops"):
        (tmp_path / f"{name}.key").write_text(SECRETS[name] + "\n")
    monkeypatch.setenv("SF_ROUTER_KEY", SECRETS["router"])
    monkeypatch.setenv("SF_EDITOR_KEY", SECRETS["editor"])
    return write_fleet(tmp_path, {"alpha": llama_target(model, binary),
                                  "beta": llama_target(model, binary)},
                       api_token={"file": str(tmp_path / "token.key")},
                       keys={"prometheus": {"file": str(tmp_path / "prom.key"),
                                            "scopes": ["read"]},
                             "router": {"env": "SF_ROUTER_KEY", "scopes": ["inference"]},
                             "editor": {"env": "SF_EDITOR_KEY", "scopes": ["inference"],
                                        "targets": ["alpha"]},
                             "ops": {"file": str(tmp_path / "ops.key"), "scopes": ["admin"]}})


def call(address: str, method: str, path: str, key: str | None = None,
         body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    status, _, data = Client(address).call(method, path, json.dumps(body).encode()
                                           if body is not None else None, headers)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode(errors="replace")


def completion(target: str) -> dict[str, Any]:
    return {"model": target, "prompt": "Hello", "max_tokens": 4}


def test_each_scope_allows_its_paths_and_refuses_the_others_naming_the_scope(
        tmp_path, model, llama_server_bin, monkeypatch, start_daemon):
    fleet = keyed_fleet(tmp_path, model, llama_server_bin, monkeypatch)
    checked = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                             capture_output=True, text=True, cwd=REPO, check=False)
    assert checked.returncode == 0, checked.stderr
    daemon = start_daemon(fleet)
    daemon.wait_state("alpha", "ready")
    daemon.wait_state("beta", "ready")
    doc = yaml.safe_load(fleet.read_text())["daemon"]
    api, proxy = doc["api"], doc["proxy"]["listen"]
    prom, router, editor, ops = (SECRETS[k] for k in ("prom", "router", "editor", "ops"))

    # Nobody, or a wrong key: 401.
    assert call(api, "GET", "/v1/targets")[0] == 401
    assert call(api, "GET", "/v1/targets", "guess")[0] == 401
    assert call(proxy, "POST", "/v1/completions", "guess", completion("alpha"))[0] == 401

    # read: the status and /metrics; not the proxy, not a restart.
    assert call(api, "GET", "/v1/targets", prom)[0] == 200
    status, metrics = call(api, "GET", "/metrics", prom)
    assert status == 200 and "specfleet_target_state" in metrics
    status, body = call(api, "POST", "/v1/targets/alpha/restart", prom)
    assert status == 403 and body["error"] == (
        "key 'prometheus' lacks the admin scope needed to POST /v1/targets/alpha/restart "
        "(it has: read)")
    status, body = call(proxy, "POST", "/v1/completions", prom, completion("alpha"))
    assert status == 403 and "key 'prometheus' lacks the inference scope" in body["error"]

    # inference: the proxy (every target, or its own); not the API.
    assert call(proxy, "POST", "/v1/completions", router, completion("beta"))[0] == 200
    assert call(proxy, "POST", "/v1/completions", editor, completion("alpha"))[0] == 200
    status, body = call(proxy, "POST", "/v1/completions", editor, completion("beta"))
    assert status == 403 and body["error"] == (
        "key 'editor' may not use target 'beta': its inference scope covers alpha")
    assert [m["id"] for m in call(proxy, "GET", "/v1/models", editor)[1]["data"]] == ["alpha"]
    status, body = call(api, "GET", "/v1/targets", router)
    assert status == 403 and "key 'router' lacks the read scope" in body["error"]

    # admin: restart and reload (and reading); not the proxy. Its name is in the events.
    assert call(api, "GET", "/v1/targets/alpha", ops)[0] == 200
    assert call(api, "POST", "/v1/targets/alpha/restart", ops)[0] == 202
    assert call(api, "POST", "/v1/reload", ops)[1] == {"reloaded": True}
    assert call(proxy, "POST", "/v1/completions", ops, completion("alpha"))[0] == 403
    # (beside the serving server: the events of its handover carry the reason)
    wait_for(lambda: [e for e in daemon.events("alpha")
                      if "restart requested through the API (key 'ops')" in e["reason"]],
             30, "the restart's event, with the key's name")
    assert ops not in json.dumps(daemon.events())
    reload = [e for e in daemon.events("-") if e["kind"] == "reload"][-1]
    assert "(asked with key 'ops')" in reload["reason"] and reload["data"]["by"] == "ops"

    # The old api_token: every scope.
    token = SECRETS["token"]
    daemon.wait_state("alpha", "ready")
    assert call(api, "GET", "/v1/targets", token)[0] == 200
    assert call(proxy, "POST", "/v1/completions", token, completion("alpha"))[0] == 200

    # The request log names each request's key, never the key.
    log = call(api, "GET", "/v1/requests", prom)[1]
    keys = {(r["target"], r["status"], r.get("key")) for r in log["requests"]}
    assert {("beta", 200, "router"), ("alpha", 200, "editor"), ("beta", 403, "editor"),
            ("alpha", 200, "api_token")} <= keys, keys
    assert not any(secret in json.dumps(log) for secret in SECRETS.values())

    # Rotated: the file is rewritten and the old key stops working at once.
    (tmp_path / "prom.key").write_text("read-0nly-rotated\n")
    assert call(api, "GET", "/v1/targets", prom)[0] == 401
    assert call(api, "GET", "/v1/targets", "read-0nly-rotated")[0] == 200


def test_the_page_logs_in_with_any_key_that_may_read_and_shows_buttons_only_to_admin(
        tmp_path, model, llama_server_bin, monkeypatch, start_daemon):
    fleet = keyed_fleet(tmp_path, model, llama_server_bin, monkeypatch)
    daemon = start_daemon(fleet)
    daemon.wait_state("alpha", "ready")
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    def login(key: str) -> Client:
        web = Client(api)
        status, headers, body = web.call("POST", "/ui/login",
                                         urllib.parse.urlencode({"token": key}).encode(), form)
        assert status == 303, (key, status, body[:200])
        web.cookie = headers["set-cookie"].split(";", 1)[0]
        return web

    # An inference key cannot log in (it may not read the status).
    status, _, body = Client(api).call("POST", "/ui/login", urllib.parse.urlencode(
        {"token": SECRETS["router"]}).encode(), form)
    assert status == 401 and b"Wrong token." in body

    reader = login(SECRETS["prom"])
    session = reader.json("/ui/session")
    assert session["key"] == "prometheus" and session["admin"] is False
    assert reader.json("/v1/targets")["targets"]
    status, _, body = reader.call("POST", "/v1/reload", headers={session["csrf_header"]:
                                                                  session["csrf"]})
    assert status == 403 and b"key 'prometheus' lacks the admin scope" in body

    admin = login(SECRETS["ops"])
    session = admin.json("/ui/session")
    assert session["key"] == "ops" and session["admin"] is True
    status, _, _ = admin.call("POST", "/v1/reload", headers={session["csrf_header"]:
                                                              session["csrf"]})
    assert status == 200


def test_a_litellm_export_uses_an_inference_key_not_the_admin_token(tmp_path, model,
                                                                    llama_server_bin,
                                                                    monkeypatch):
    fleet = keyed_fleet(tmp_path, model, llama_server_bin, monkeypatch)
    done = subprocess.run([sys.executable, "-m", "supervisor", "export", "litellm", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    keys = {e["model_name"]: e["litellm_params"]["api_key"] for e in config["model_list"]}
    # The first inference key that covers each target: router covers both.
    assert keys == {"alpha": "os.environ/SF_ROUTER_KEY", "beta": "os.environ/SF_ROUTER_KEY"}
    doc = yaml.safe_load(fleet.read_text())
    del doc["daemon"]["keys"]["router"]
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "supervisor", "export", "litellm", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    keys = {e["model_name"]: e["litellm_params"]["api_key"]
            for e in yaml.safe_load(done.stdout)["model_list"]}
    # editor covers alpha only; beta falls back on the api_token, read from a file.
    assert keys == {"alpha": "os.environ/SF_EDITOR_KEY",
                    "beta": "os.environ/SPECFLEET_API_TOKEN"}


def test_prometheus_scrapes_metrics_with_the_read_key(tmp_path, model, llama_server_bin,
                                                      monkeypatch, start_daemon):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus, as .ci/run does)")
    fleet = keyed_fleet(tmp_path, model, llama_server_bin, monkeypatch)
    daemon = start_daemon(fleet)
    daemon.wait_state("alpha", "ready")
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    # The scrape config docs/api.md gives, with the read key's file.
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "specfleet", "static_configs": [{"targets": [api]}],
                            "authorization": {"credentials_file": str(tmp_path / "prom.key")}}],
    }))
    web = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    prom = subprocess.Popen([binary, f"--config.file={config}", f"--web.listen-address={web}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
                            stdout=log, stderr=log)
    try:
        def scraped() -> Any:
            query = urllib.parse.urlencode({"query": 'specfleet_target_state{state="ready"}'})
            try:
                status, body = call(web, "GET", f"/api/v1/query?{query}")
            except OSError:
                return None  # not listening yet
            found = body.get("data", {}).get("result", []) if status == 200 else []
            return {r["metric"]["target"]: r["value"][1] for r in found} or None
        ready = wait_for(scraped, 60, "Prometheus to scrape /metrics with the read key")
        assert ready.get("alpha") == "1"
        up = call(web, "GET", "/api/v1/targets")[1]["data"]["activeTargets"][0]
        assert up["health"] == "up" and not up["lastError"]
    finally:
        prom.terminate()
        prom.wait(30)
        log.close()
