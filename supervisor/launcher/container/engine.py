"""The container engine's CLI (podman or docker), run through asyncio subprocesses.

No daemon socket: podman has none to talk to, and both engines' CLIs take the same
subcommands and print the same `inspect` JSON for what specfleet reads (State, Config.Labels,
Id, Digest).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Sequence
from typing import Any

from supervisor.errors import SpecfleetError

ENGINES = ("podman", "docker")


class EngineError(SpecfleetError):
    """The engine refused: its own message (stderr) is the text."""


def find_engine(wanted: str) -> str:
    """The engine's name: `podman`/`docker` if installed; `auto`: podman first."""
    names = ENGINES if wanted == "auto" else (wanted,)
    for name in names:
        if shutil.which(name):
            return name
    raise SpecfleetError(f"container engine {' or '.join(names)} was not found on PATH "
                         "(launcher: container runs targets with podman or docker)")


class Engine:
    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, *args: str, timeout: float = 120.0) -> str:
        """stdout of `<engine> args...`; EngineError with the engine's stderr if it fails."""
        proc = await asyncio.create_subprocess_exec(
            self.name, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise EngineError(f"{self.name} {args[0]} did not answer within {timeout:.0f} s") \
                from None
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
            raise EngineError(text or f"{self.name} {args[0]} exited with {proc.returncode}")
        return out.decode(errors="replace")

    async def inspect(self, *args: str) -> list[dict[str, Any]]:
        """`inspect` output; [] when the object does not exist."""
        try:
            out = await self.run(*args)
        except EngineError as exc:
            if "no such" in str(exc).lower() or "not known" in str(exc).lower():
                return []
            raise
        data = json.loads(out or "[]")
        return data if isinstance(data, list) else []

    async def container(self, name: str) -> dict[str, Any] | None:
        found = await self.inspect("container", "inspect", name)
        return found[0] if found else None

    async def image(self, ref: str) -> dict[str, Any]:
        """The image's `inspect`; EngineError with the engine's message when it is absent."""
        found = await self.run("image", "inspect", ref)
        data = json.loads(found or "[]")
        if not data:
            raise EngineError(f"{ref}: image not known")
        return data[0]

    async def remove(self, name: str) -> None:
        """Remove the container, running or not; one that is gone already is no error."""
        try:
            await self.run("rm", "-f", name)
        except EngineError as exc:
            if "no such" not in str(exc).lower():
                raise

    async def labelled(self, label: str, value: str) -> list[str]:
        """Names of containers, running or not, with that label value."""
        out = await self.run("ps", "-a", "--filter", f"label={label}={value}",
                             "--format", "{{.Names}}")
        return [n for line in out.splitlines() for n in line.split(",") if n.strip()]


def labels(info: dict[str, Any]) -> dict[str, str]:
    return dict((info.get("Config") or {}).get("Labels") or {})


def image_facts(ref: str, info: dict[str, Any]) -> dict[str, str]:
    """What the run record says of the image: its reference, id and digest."""
    digests: Sequence[str] = info.get("RepoDigests") or ()
    digest = str(info.get("Digest") or "") or (digests[0].rsplit("@", 1)[-1] if digests else "")
    return {"image": ref, "image_id": str(info.get("Id") or ""), "image_digest": digest}
