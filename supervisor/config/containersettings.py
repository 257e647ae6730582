"""The fleet file's `container:` keys of a target with `launcher: container` (docs/containers.md).

Kept apart from schema.py, which holds the keys every launcher shares.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from supervisor.config.strict import Strict

Engine = Literal["auto", "podman", "docker"]
# `--ulimit` values as both engines take them: NAME=SOFT[:HARD].
_ULIMIT = r"^[a-z]+=(-1|\d+)(:(-1|\d+))?$"


class ContainerSettings(Strict):
    """How a target with `launcher: container` runs in an image (docs/containers.md)."""

    image: str | None = Field(default=None, description=(
        "The image that holds the runtime, such as `ghcr.io/ggml-org/llama.cpp:server` or a "
        "local `localhost/llama-server:b6000`; required with `launcher: container`. It must "
        "be present: specfleet never pulls (a missing image fails the target with the "
        "engine's own message)."))
    engine: Engine = Field(default="auto", description=(
        "`podman` or `docker`; `auto`: whichever is installed, podman first."))
    runtime: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_./-]+$", description=(
        "The OCI runtime (`--runtime`), such as `runc` where crun cannot run; unset: the "
        "engine's default."))
    ulimits: tuple[str, ...] = Field(
        default=(), description=(
            "`--ulimit` values such as `nofile=4096:4096`; unset: the engine's defaults."))
    volumes: tuple[str, ...] = Field(default=(), description=(
        "More host paths mounted read-only at the same path (files the `args:` name); the "
        "model and draft files are mounted without being listed."))
    run_args: tuple[str, ...] = Field(default=(), description=(
        "Extra arguments of `<engine> run`, before the image (such as `--shm-size=8g`); "
        "specfleet sets the name, labels, network, mounts, GPUs and environment itself."))

    @field_validator("ulimits")
    @classmethod
    def _ulimits(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for limit in value:
            if not re.match(_ULIMIT, limit):
                raise ValueError(f"{limit!r} is not a ulimit: expected NAME=SOFT[:HARD] such "
                                 "as nofile=4096:4096")
        return value

    @field_validator("volumes")
    @classmethod
    def _absolute(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not path.startswith(("/", "~")):
                raise ValueError(f"{path!r} is not an absolute path")
        return value
