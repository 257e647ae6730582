"""How the numbers specfleet shows and stores are rounded: one function, so that a rate in
an event, in tuning.json and on the status page is the same number."""

from __future__ import annotations


def rounded(x: float | None, digits: int = 4) -> float | None:
    """x to `digits` places, None kept."""
    return None if x is None else round(x, digits)
