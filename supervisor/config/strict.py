"""The base of every fleet-file model (unknown keys refused, frozen, strict scalars), and
the value types they share (durations, fractions, sizes).

Frozen, so that a reload can compare a target's old and new definition with `==` and
restart only what changed.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from supervisor.config.measures import parse_duration, parse_fraction, parse_size
from supervisor.config.scalars import strict_scalar

Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Fraction = Annotated[float, BeforeValidator(parse_fraction), Field(ge=0, le=1)]
Bytes = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        # No `port: true` as 1, no `enabled: 1` as true (supervisor/config/scalars.py).
        return strict_scalar(value, cls.model_fields[str(info.field_name)])
