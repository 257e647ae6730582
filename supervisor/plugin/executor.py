"""Where a runtime's executable runs: on this machine, or inside a container image.

A backend asks its runtime questions before starting it (llama-server's `--help` and
`--version`). Under `launcher: container` the executable is not on this machine but in the
image, so the launcher hands the backend an Executor that runs the same command there
(`podman run --rm --entrypoint llama-server IMAGE --help`). Backends use `output()` and
`identity` and never build engine command lines themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from supervisor.errors import SpecfleetError

# `run` itself failed (125), or the command cannot be invoked (126) or found (127) in the
# image: both engines' exit statuses, the shell's convention. Anything else is the command's.
ENGINE_FAILED = (125, 126, 127)


def _on_this_machine(argv: Sequence[str]) -> list[str]:
    return list(argv)


@dataclass(frozen=True)
class Executor:
    """Runs a runtime's command where the runtime lives."""

    # The command line that runs `argv` there; on this machine, argv itself.
    wrap: Callable[[Sequence[str]], list[str]] = _on_this_machine
    # What identifies the executables there (an image id); "": the file's own identity.
    identity: str = ""
    # Facts for the run record (the image reference, id and digest); {} on this machine.
    facts: Mapping[str, str] = field(default_factory=dict)

    @property
    def in_image(self) -> bool:
        return bool(self.identity)

    async def output(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        """stdout and stderr of the command, run to its end."""
        command = self.wrap(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL)
        except OSError as exc:
            raise SpecfleetError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise SpecfleetError(f"{' '.join(argv)} did not answer within {timeout:.0f} s"
                                 + (f" (in {self.facts.get('image')})" if self.in_image
                                    else "")) from exc
        text = out.decode(errors="replace")
        if self.in_image and proc.returncode in ENGINE_FAILED:
            raise SpecfleetError(f"{argv[0]} cannot run in {self.facts.get('image', 'the image')}"
                                 f" (exit status {proc.returncode}): {text.strip()[-500:]}")
        return text


LOCAL = Executor()
