"""The fleet file's Ray keys: `daemon.ray` (which cluster) and a target's `ray` (where on it).

`launcher: ray` (docs/ray.md). Kept apart from schema.py, which holds the keys every
launcher shares.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from supervisor.config.strict import Strict

# A Ray namespace or node name: what `ray start` and Ray's API accept without quoting.
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$"


class RaySettings(Strict):
    """The Ray cluster `launcher: ray` runs targets on (docs/ray.md)."""

    address: str = Field(default="auto", description=(
        "The cluster: `auto` (the one `ray start` runs on this machine), `HOST:PORT` of the "
        "head's GCS (`ray start --head --port`), or `local` (a private one-node cluster "
        "started by the daemon, for a single box)."))
    namespace: str = Field(default="specfleet", pattern=_NAME, description=(
        "Ray namespace of the targets' actors (`specfleet/<target>`): two daemons on one "
        "cluster need two namespaces."))
    connect_timeout: Annotated[float, Field(gt=0, le=600)] = Field(default=60.0, description=(
        "Seconds to wait for a target's actor to be placed on its node and answer."))


class RayPlacement(Strict):
    """Where on the Ray cluster a target with `launcher: ray` runs (docs/ray.md)."""

    nodes: tuple[Annotated[str, Field(pattern=_NAME)], ...] = Field(default=(), description=(
        "Nodes the target may run on, in order of preference: each a node's hostname, IP "
        "address, node id (or its first 8+ characters), a value of one of its labels, or a "
        "custom resource it declares (`ray start --resources '{\"box-a\": 1}'`); the first "
        "that is alive and fits is used, the next ones when it dies. Empty: any node that fits."))
    resources: dict[Annotated[str, Field(pattern=_NAME)], Annotated[float, Field(gt=0, le=1e9)]] = Field(
        default_factory=dict, description=(
            "Custom Ray resources the target's actor claims on its node (such as `{vram_gib: 20}`)."))
    num_cpus: Annotated[float, Field(ge=0, le=1024)] = Field(default=0.0, description=(
        "CPUs the actor claims in Ray's books (0: the runtime's threads are not counted, so a "
        "small node still takes it)."))

    @field_validator("nodes")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a node is listed twice")
        return value
