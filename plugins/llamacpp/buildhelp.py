"""What a llama-server build says of itself: its `--help` text and `--version` line, asked
once per binary and kept on disk by the binary's SHA-256 (`<cache>/llama-help/`), so
that `specfleet check` does not run every binary at every check, and a binary rebuilt or
replaced in place (another hash) is asked again. A binary inside an image is asked through
the launcher's executor, once per image and command per daemon.

The help's flags (helpflags.py) are what a command line is checked against: at `check`
for a target's extra `args` and for the flags specfleet generates, and at each start.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from plugins.llamacpp.helpflags import HelpFlags, flag_problems, parse_help
from supervisor.plugin import Executor, SpecfleetError, cache_root, file_identity, file_sha256

HELP_TIMEOUT = 30.0  # seconds: --help loads no model; a slow disk may still take a while


@dataclass(frozen=True)
class Build:
    """One llama-server binary, as its own `--help` and `--version` describe it."""

    binary: str
    help_text: str
    version: str  # the `version:` line's value, e.g. "11434 (a1e7ab7)"

    @functools.cached_property
    def flags(self) -> HelpFlags:
        return parse_help(self.help_text)

    def problems(self, argv: list[str] | tuple[str, ...]) -> list[tuple[int, str, str]]:
        """(index, flag, message) for each flag of `argv` this build does not take; the
        message names the build and, where its help says one, the replacement."""
        return [(i, flag, f"{flag}: llama-server {self.version} ({self.binary}) {_says(why)}")
                for i, flag, why in flag_problems(argv, self.flags)]


def _says(why: str) -> str:
    """"is listed as removed: use X" -> "lists it as removed: use X"."""
    return why.replace("is listed as", "lists it as", 1).replace(
        "is not one of its flags", "does not list it", 1)


_by_identity: dict[object, Build] = {}


def local_build(binary: str) -> Build:
    """The build at `binary` on this machine (its help read once per hash, kept on disk)."""
    identity = file_identity(binary)
    if identity is None:
        raise SpecfleetError(f"cannot read {binary}")
    if identity in _by_identity:
        return _by_identity[identity]
    digest = file_sha256(Path(binary))
    kept = cache_root() / "llama-help" / f"{digest}.json"
    try:
        data = json.loads(kept.read_text())
        build = Build(binary, data["help"], data["version"])
    except (OSError, ValueError, KeyError):
        build = Build(binary, _run(binary, "--help"), _version(_run(binary, "--version")))
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(".tmp")
        tmp.write_text(json.dumps({"help": build.help_text, "version": build.version}))
        tmp.replace(kept)
    _by_identity[identity] = build
    return build


_in_images: dict[object, Build] = {}


async def build_in(binary: str, executor: Executor) -> Build:
    """The build that `binary` names where the executor runs it (an image, or here)."""
    if not executor.in_image:
        return await asyncio.to_thread(local_build, binary)
    key = (executor.identity, binary)
    if key not in _in_images:
        help_text = await executor.output([binary, "--help"])
        version = await executor.output([binary, "--version"])
        _in_images[key] = Build(binary, help_text, _version(version))
    return _in_images[key]


def _run(binary: str, flag: str) -> str:
    try:
        done = subprocess.run([binary, flag], capture_output=True, text=True,
                              timeout=HELP_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SpecfleetError(f"{binary} {flag} did not answer: {exc}") from None
    return done.stdout + done.stderr


def _version(text: str) -> str:
    line = next((ln for ln in text.splitlines() if ln.startswith("version")), "unknown")
    return line.removeprefix("version:").strip()
