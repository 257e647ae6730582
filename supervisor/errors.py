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


class Untrusted(SpecfleetError):
    """A ModelKit whose signature the trust policy refuses: final (never retried), and never
    a reason to stop a server that serves (a reload's change is then not applied)."""


class Lacking(SpecfleetError):
    """What this host lacks for one target now, found before its start: a model or draft
    file missing, unreadable or truncated, a runtime binary that is not there. The target
    waits in `waiting` and looks again (supervision/waiting.py); the fleet is not touched."""


class NotReachableYet(SpecfleetError):
    """A start that may work later: what it runs on (a Ray cluster's head, a registry with
    nothing cached) does not answer now. The target waits and tries again, never gives up."""
