"""plugins/command.py: any OpenAI-compatible server started by the fleet file's command.
Its options are checked as every key is; its command line, health check and counters
against a real HTTP server on a socket (aiohttp's test server)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from plugins.command import CommandBackend
from supervisor.config.schema import Target
from supervisor.plugin import Readiness

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def target(port: int = 8090, **over: object) -> Target:
    settings: dict[str, object] = {
        "name": "tabby", "backend": "command", "model": "/models/qwen", "port": port,
        "options": {"command": ["/opt/tabby/start.sh", "--port", "{port}", "--model",
                                "{model}"]}}
    settings.update(over)
    return Target(**settings)  # type: ignore[arg-type]


def test_the_command_fills_its_placeholders():
    spec = CommandBackend(target()).launch_spec()
    assert spec.argv == ("/opt/tabby/start.sh", "--port", "8090", "--model", "/models/qwen")
    tuned = target(options={"command": ["srv", "--draft", "{draft_length}", "--port", "{port}"],
                            "metrics": {"names": "llamacpp"}},
                   speculation={"method": "draft", "draft": "/models/small.gguf"})
    assert CommandBackend(tuned).launch_spec(6).argv[2] == "6"
    assert CommandBackend(tuned).launch_spec(6, speculation=False).argv[2] == "0"
    assert CommandBackend(tuned).tunable_length() == "{draft_length} in the command"
    assert CommandBackend(target()).tunable_length() is None


def test_the_stop_signal_reaches_the_launch_and_every_launchers_way_of_stopping():
    from supervisor.launcher.container import command as container
    from supervisor.launcher.systemd.unitfile import render_target

    polite = CommandBackend(target(options={"command": ["srv", "{port}"],
                                            "stop_signal": "SIGINT"})).launch_spec()
    plain = CommandBackend(target()).launch_spec()
    assert polite.stop_signal == "SIGINT" and plain.stop_signal == "SIGTERM"
    unit = render_target("t", polite, description="d", stop_grace=5, working_directory="/",
                         env_file=None)
    assert "KillSignal=SIGINT" in unit.splitlines()
    run = container.ContainerRun("podman", "img")
    argv = container.run_argv("t", polite, run)
    assert argv[argv.index("--stop-signal") + 1] == "SIGINT"
    assert "--stop-signal" not in container.run_argv("t", plain, run)
    problems = CommandBackend.check(target(options={"command": ["srv", "{port}"],
                                                    "stop_signal": "SIGKILL"}))
    assert problems[0].path == ("options", "stop_signal")
    assert "SIGINT" in problems[0].message


def test_bad_options_are_fleet_file_errors_at_their_place():
    problems = CommandBackend.check(target(options={"command": ["srv", "{prot}"],
                                                    "helth": {}}))
    said = {p.path: p.message for p in problems}
    assert "unknown key 'helth'" in said[("options", "helth")]
    assert "{prot}" in said[("options", "command")] and "{port}" in said[("options", "command")]
    problems = CommandBackend.check(target(options={"command": ["srv"],
                                                    "metrics": {"names": "sglang"}}))
    assert problems[0].path == ("options", "metrics", "names")
    assert "expected one of: llamacpp, vllm" in problems[0].message
    assert CommandBackend.check(target(options={"command": []}))[0].path == ("options",
                                                                             "command")
    # No {port}: a warning; speculation without a way to tune it: an error.
    warned = CommandBackend.check(target(options={"command": ["/bin/true"]}))
    assert [p.severity for p in warned] == ["warning"]
    missing = CommandBackend.check(target())  # /opt/tabby/start.sh is not on this machine
    assert [(p.path, p.severity) for p in missing] == [(("options", "command", 0), "missing")]
    spec = CommandBackend.check(target(speculation={"method": "ngram"},
                                       options={"command": ["/bin/true", "{port}"]}))
    assert spec[0].path == ("speculation", "method") and "{draft_length}" in spec[0].message
    here = target(options={"command": ["/bin/true", "--port", "{port}"]})
    assert CommandBackend.check(here) == []


def test_memory_is_a_size_for_the_on_demand_plan():
    sized = CommandBackend(target(options={"command": ["srv", "{port}"], "memory": "6GiB"}))
    estimate = sized.memory_estimate(on_gpu=True)
    assert estimate is not None and estimate.total == 6 * 1024**3
    assert CommandBackend(target()).memory_estimate(on_gpu=True) is None


async def test_the_health_check_and_the_counters_of_a_real_http_server():
    state = {"health": 503}
    metrics = (FIXTURES / "llama_server_metrics.txt").read_text()

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=state["health"])

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(text=metrics)

    async def completions(_: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "!"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        backend = CommandBackend(target(
            port=server.port, host="127.0.0.1",
            options={"command": ["srv", "{port}"], "health": {"path": "/health",
                                                              "completion": True},
                     "metrics": {"names": "llamacpp"}}))
        async with aiohttp.ClientSession() as http:
            assert (await backend.probe(http)).readiness is Readiness.LOADING
            state["health"] = 200
            assert (await backend.probe(http)).readiness is Readiness.READY
            state["health"] = 500
            assert (await backend.probe(http)).readiness is Readiness.UNHEALTHY
            sample = await backend.read_metrics(http)
        assert sample is not None and sample.tokens_predicted > 0 and sample.prompt_tokens > 0
    finally:
        await server.close()
