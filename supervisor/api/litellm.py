"""The fleet as a LiteLLM proxy config: `specfleet export litellm FILE` and GET /v1/litellm.

Pure. Each target becomes a `model_list` entry (model_name = the target's name,
litellm_params.model "openai/<name>", api_base, and the API key as a reference,
"os.environ/VAR", never the key; a key file becomes a variable that `notes` explains).
Through the proxy the key is an inference key of `daemon.keys` that covers the target (a
router needs no more), else the api_token.
With specfleet's proxy on, api_base is the proxy: it holds requests while a target
restarts (a crash or a retune) instead of failing them.
LiteLLM's own background health checks send a real completion to every model (loading
models that were unloaded): the suggested settings turn them off and rely on cooldowns;
specfleet's GET /healthz and /v1/targets tell readiness without touching a model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from supervisor.config.schema import ApiKey, Fleet, Target

# LiteLLM reads a key from the environment ("os.environ/VAR"), never from a file: a key that
# specfleet reads from a file becomes a variable that LiteLLM's host must set to the file's
# contents. One variable per file: the daemon's token, and each target's own key.
TOKEN_VARIABLE = "SPECFLEET_API_TOKEN"


def _upper(name: str) -> str:
    return re.sub(r'[^A-Z0-9]+', '_', name.upper()).strip('_')


def _file_variable(target: str | None) -> str:
    """The variable for a key file: the api_token's, a target's (`t:NAME`), a named key's."""
    if target is None:
        return TOKEN_VARIABLE
    if target.startswith("key:"):
        return f"SPECFLEET_{_upper(target[4:])}_KEY"
    return f"SPECFLEET_{_upper(target)}_API_KEY"


def _key_reference(key: ApiKey | None, target: str | None) -> str | None:
    """A clean `os.environ/VAR` that LiteLLM resolves; what VAR must hold is in `notes`."""
    if key is None:
        return None
    return f"os.environ/{key.env or _file_variable(target)}"


def _key_source(fleet: Fleet, name: str) -> tuple[ApiKey | None, str | None, str]:
    """The key a request for target `name` needs: (key, its variable's name part, setting).
    Through the proxy, the first inference key that covers the target, else the api_token
    (a router needs only inference: a leaked router config must not restart targets)."""
    if fleet.daemon.proxy.enabled:
        for key_name, key in fleet.daemon.keys.items():
            if "inference" in key.scopes and (key.targets is None or name in key.targets):
                return key, f"key:{key_name}", f"daemon.keys.{key_name}"
        return fleet.daemon.api_token, None, "daemon.api_token"
    return fleet.targets[name].api_key, name, f"targets.{name}.api_key"


def notes(fleet: Fleet) -> list[str]:
    """What the operator must do for the config to work: one line per variable that stands
    for a key file (for a YAML comment, or stderr next to JSON)."""
    out: dict[str, str] = {}
    for name in fleet.targets:
        key, target, setting = _key_source(fleet, name)
        if key is not None and key.file is not None:
            var = _file_variable(target)
            out[var] = (f"set {var} in LiteLLM's environment to the contents of {key.file} "
                        f"({setting}.file); LiteLLM reads keys from the environment only")
    return list(out.values())


def config(fleet: Fleet, placement_info: Callable[[Target], dict[str, Any]] = lambda t: {},
           ) -> dict[str, Any]:
    proxy = fleet.daemon.proxy
    model_list = []
    for name, target in fleet.targets.items():
        if proxy.enabled:
            host, _, port = proxy.listen.rpartition(":")
            host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
            api_base = f"http://{host}:{port}/v1"
        else:
            api_base = f"{target.base_url}/v1"
        key = _key_reference(*_key_source(fleet, name)[:2])
        params: dict[str, Any] = {"model": f"openai/{name}", "api_base": api_base}
        params["api_key"] = key or "none"  # the openai client needs some key
        info: dict[str, Any] = {"id": f"specfleet-{name}", "backend": target.backend}
        info.update(placement_info(target))  # where its launcher runs it (Ray's nodes)
        model_list.append({"model_name": name, "litellm_params": params, "model_info": info})
    return {
        "model_list": model_list,
        "router_settings": {
            "routing_strategy": "simple-shuffle",
            "num_retries": 2,
            "timeout": 600,
            "allowed_fails": 3,  # then the deployment cools down...
            "cooldown_time": 30,  # ...for 30 s, about one llama-server restart
        },
        "general_settings": {
            # LiteLLM's background health check runs a completion per model; specfleet's
            # proxy already waits for restarting targets, and /healthz never loads a model.
            "background_health_checks": False,
        },
    }
