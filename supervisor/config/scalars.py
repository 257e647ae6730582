"""Where a YAML scalar meets the schema more strictly than pydantic's lax mode.

Pydantic would take `port: true` as 1 and `enabled: 1` or `enabled: "yes"` as true. In a
fleet file those are mistakes, so a number field refuses true/false, and a boolean field
takes only true/false (or the text "true"/"false", which is what `${VAR}` gives). Text of
digits stays a valid number (`port: "8080"`, `port: ${PORT}`): environment expansion
always produces text.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BeforeValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError


def unwrap_annotation(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated (NoneType included)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return unwrap_annotation(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in unwrap_annotation(arg)]
    return [annotation]


def _number_words(kinds: list[Any]) -> str | None:
    """How the field's numbers are described, or None if it takes no plain number."""
    literals = [v for k in kinds if typing.get_origin(k) is typing.Literal
                for v in typing.get_args(k) if isinstance(v, int) and not isinstance(v, bool)]
    if literals:
        return "the number " + " or ".join(str(v) for v in literals)
    if int in kinds:
        return "a whole number"
    if float in kinds:
        return "a number"
    return None


def strict_scalar(value: Any, field: FieldInfo) -> Any:
    """`value` as the field may take it, or a PydanticCustomError saying what it expected.
    Fields with a validator of their own (durations, sizes, fractions, gpus) are left to it."""
    if any(isinstance(m, BeforeValidator) for m in field.metadata):
        return value
    kinds = unwrap_annotation(field.annotation)
    if Any in kinds:
        return value
    if bool in kinds:
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if not isinstance(value, bool) and value is not None:
            raise PydanticCustomError("strict_bool", "expected true or false")
        return value
    words = _number_words(kinds)
    if words is not None and isinstance(value, bool):
        raise PydanticCustomError("strict_number", "expected {words}", {"words": words})
    return value


def env_name(name: str) -> str:
    """An environment variable's name as execve takes it: not empty, no `=`, no NUL."""
    if not name:
        raise ValueError("an environment variable's name cannot be empty")
    for bad, shown in (("=", "'='"), ("\0", "a NUL character")):
        if bad in name:
            raise ValueError(f"not a valid environment variable name (it cannot contain {shown})")
    return name
