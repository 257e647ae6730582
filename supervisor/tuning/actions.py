"""What a tuning decision is: its action, the memory it leaves, why; the lengths it may pick.

Shared by every layer that decides (decisions.py, variants.py, by_load.py, holding.py),
apart from any of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from supervisor.tuning.store import TunerMemory


class Action(enum.StrEnum):
    """What a decision does. Every action but KEEP restarts the runtime with the memory's
    setting (a str, so that events and tuning.json carry the plain word)."""

    BASELINE = "baseline"  # speculation off for a while, to measure throughput without it
    RESTORE = "restore"  # the baseline is measured: speculation back on
    RETUNE = "retune"  # another draft length, chosen from what was measured
    EXPLORE = "explore"  # a length not measured yet, to learn what it gives
    DISABLE = "disable"  # speculation does not pay: off, re-probed later
    ENABLE = "enable"  # the re-probe after a time off
    VARIANT = "variant"  # another n-gram variant (tuning/variants.py)
    BY_LOAD = "by-load"  # draft lengths by requests running (tuning/by_load.py)
    KEEP = "keep"  # the setting in effect stays: no restart


@dataclass(frozen=True)
class Decision:
    action: Action
    memory: TunerMemory  # the memory once the decision is applied
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bounds:
    current: int  # the draft length in effect
    low: int
    high: int
    tunable: bool  # False: only on/off (e.g. ngram-cache)
