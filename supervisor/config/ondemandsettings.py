"""The fleet file's keys for loading a target on demand and unloading it (docs/on-demand.md):
`start`, `idle_unload`, `evictable`, `group`, `min_residency`, per target and in `defaults`.

Kept apart from schema.py, which holds the keys of every target; `Target` and
`TargetDefaults` inherit these.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from supervisor.config.measures import parse_duration
from supervisor.config.strict import Strict

_Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
_Group = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
StartMode = Literal["always", "on_demand"]


class LoadingKeys(Strict):
    """When a target runs: from the daemon's start, or from its first request; and when it
    makes room for others."""

    start: StartMode = Field(default="always", description=(
        "`always`: started with the daemon and kept running; `on_demand`: listed as "
        "`unloaded` until the first request through the proxy starts it (the request waits, "
        "within `daemon.proxy.hold`)."))
    idle_unload: _Duration | None = Field(default=None, description=(
        "Unload the target after this long without a request through the proxy (its next "
        "request loads it again); unset: never."))
    evictable: bool = Field(default=True, description=(
        "Whether a target that loads on demand may be unloaded to make room in GPU memory "
        "for another; `false` pins it once loaded."))
    group: _Group | None = Field(default=None, description=(
        "Targets of one group never run at the same time: loading one unloads the others "
        "(llama-swap's swap group)."))
    min_residency: _Duration = Field(default=30.0, description=(
        "A target loaded on demand is not unloaded for another within this long after it "
        "started: requests for the other wait, so that alternating clients cannot make the "
        "box thrash."))

    @property
    def swaps(self) -> bool:
        """Whether it may be unloaded and loaded while the daemon runs (on-demand loading)."""
        return self.start == "on_demand" or self.idle_unload is not None \
            or self.group is not None


class LoadingDefaults(Strict):
    """The same keys under `defaults:`, unset unless written."""

    start: StartMode | None = None
    idle_unload: _Duration | None = None
    evictable: bool | None = None
    group: _Group | None = None
    min_residency: _Duration | None = None
