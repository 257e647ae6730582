"""The fleet as a LiteLLM proxy config: `specfleet export litellm FILE` and GET /v1/litellm.

Pure. Each target becomes a `model_list` entry (model_name = the target's name,
litellm_params.model "openai/<name>", api_base, and the API key as a reference,
"os.environ/VAR", never the key). With specfleet's proxy on, api_base is the proxy: it
holds requests while a target restarts (a crash or a retune) instead of failing them.
LiteLLM's own background health checks send a real completion to every model (loading
models that were unloaded): the suggested settings turn them off and rely on cooldowns;
specfleet's GET /healthz and /v1/targets tell readiness without touching a model.
"""

from __future__ import annotations

from typing import Any

from supervisor.config.schema import ApiKey, Fleet


def _key_reference(key: ApiKey | None) -> str | None:
    if key is None:
        return None
    if key.env:
        return f"os.environ/{key.env}"
    return f"os.environ/SPECFLEET_KEY_FROM_FILE  # contents of {key.file}"


def config(fleet: Fleet) -> dict[str, Any]:
    proxy = fleet.daemon.proxy
    model_list = []
    for name, target in fleet.targets.items():
        if proxy.enabled:
            host, _, port = proxy.listen.rpartition(":")
            host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
            api_base = f"http://{host}:{port}/v1"
            key = _key_reference(fleet.daemon.api_token)
        else:
            api_base = f"{target.base_url}/v1"
            key = _key_reference(target.api_key)
        params: dict[str, Any] = {"model": f"openai/{name}", "api_base": api_base}
        params["api_key"] = key or "none"  # the openai client needs some key
        model_list.append({"model_name": name, "litellm_params": params,
                           "model_info": {"id": f"specfleet-{name}", "backend": target.backend}})
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
