"""The one error type whose message is safe and useful to show a user.

Anything else that escapes is a bug and gets a traceback; a SpecfleetError gets
its message and an exit status, never a traceback.
"""

from __future__ import annotations


class SpecfleetError(Exception):
    """A failure the user can act on; `str()` is the whole message."""

    exit_code = 1


class FleetFileError(SpecfleetError):
    """A fleet file that cannot be used; carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class StartRefused(SpecfleetError):
    """A start that cannot work (the pairing guard, the VRAM planner); says why, with numbers."""


class NotReachableYet(SpecfleetError):
    """A start that may work later: what it runs on (a Ray cluster's head) does not answer
    now. Retried with the restart policy's backoff, not given up at once."""
