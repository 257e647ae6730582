"""A third-party specfleet backend: any OpenAI-compatible server started by a fixed command.

    targets:
      my-server:
        backend: openai-command
        model: my-model                       # the model name the server answers to
        port: 8090
        options:
          command: [/opt/srv/bin/server, --port, "{port}", --host, "{host}"]

`{port}`, `{host}` and `{model}` in the command are filled in. Readiness is GET /v1/models
answering 200. The server does its own speculation (if any): `speculation` must stay none,
and there are no acceptance counters to read, so nothing is tuned.
"""

from __future__ import annotations

import aiohttp

from supervisor.plugin import (
    Backend,
    LaunchSpec,
    Probe,
    Problem,
    Readiness,
    Target,
    hookimpl,
)


class OpenAICommandBackend(Backend):
    name = "openai-command"
    description = "an OpenAI-compatible server started by a fixed command"

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        problems = []
        command = target.options.get("command")
        if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
            problems.append(Problem(("options", "command"), "expected the server's command as a "
                                    "list of strings, e.g. [/usr/bin/server, --port, '{port}']"))
        elif not any("{port}" in a for a in command):
            problems.append(Problem(("options", "command"), "the command never mentions {port}: "
                                    "the server would not listen where specfleet probes it",
                                    "warning"))
        unknown = set(target.options) - {"command"}
        if unknown:
            problems.append(Problem(("options", sorted(unknown)[0]), "unknown option; the "
                                    "openai-command backend takes only command"))
        if target.speculation.method != "none":
            problems.append(Problem(("speculation", "method"), "the openai-command backend "
                                    "cannot configure speculation; set it in the command"))
        return problems

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: object | None = None) -> LaunchSpec:
        t = self.target
        values = {"port": str(t.port), "host": t.host, "model": t.model}
        argv = tuple(arg.format(**values) for arg in t.options["command"])
        return LaunchSpec(argv, dict(t.env))

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        async with http.get(f"{self.target.base_url}/v1/models",
                            headers=self.auth_headers()) as resp:
            if resp.status == 200:
                return Probe(Readiness.READY)
            if resp.status == 503:
                return Probe(Readiness.LOADING, "503 while loading")
            return Probe(Readiness.UNHEALTHY, f"HTTP {resp.status}")


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(OpenAICommandBackend)
