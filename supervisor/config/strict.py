"""The base of every fleet-file model: unknown keys refused, frozen, strict scalars.

Frozen, so that a reload can compare a target's old and new definition with `==` and
restart only what changed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from supervisor.config.scalars import strict_scalar


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        # No `port: true` as 1, no `enabled: 1` as true (supervisor/config/scalars.py).
        return strict_scalar(value, cls.model_fields[str(info.field_name)])
