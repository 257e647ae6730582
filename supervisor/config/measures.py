"""Durations ("2s", "500ms", "5m", "1h30m") and byte sizes ("10MiB") as a sysadmin writes them."""

from __future__ import annotations

import math
import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
                "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}
# Every duration and size in a fleet file is finite and bounded: `interval: 1e400` or
# `99999999999999999999h` would otherwise pass and then turn health checks off or overflow
# deep in the daemon (int(inf)). A year and a pebibyte are past any real setting.
MAX_DURATION = 365 * 86400.0
MAX_DURATION_TEXT = "365d (a year)"
MAX_SIZE = 1024**5
MAX_SIZE_TEXT = "1024TiB"


def parse_duration(value: object) -> float:
    """Seconds from a number (seconds) or a string like "1h30m", "2s", "250ms"; at most
    MAX_DURATION."""
    seconds = _duration(value)
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError(f"expected a duration of at most {MAX_DURATION_TEXT}")
    return seconds


def _duration(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 1h")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        pos, total = 0, 0.0
        for m in _DURATION_PART.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
        try:
            return float(text)
        except ValueError:
            pass
    raise ValueError("expected a duration such as 30s, 5m, 1h30m or a number of seconds")


def parse_size(value: object) -> int:
    """Bytes from a number or a string like "10MiB", "512M", "2G"; at most MAX_SIZE."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = (m.group(2) or "").upper().removesuffix("B")
        size = int(float(m.group(1)) * _SIZE_FACTOR[unit])
    else:
        raise ValueError("expected a size such as 10MiB, 512MB or a number of bytes")
    if size > MAX_SIZE:
        raise ValueError(f"expected a size of at most {MAX_SIZE_TEXT}")
    return size


def parse_fraction(value: object) -> float:
    """A share from "5%" or a number (0.05)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100.0
        except ValueError:
            pass
        raise ValueError("expected a percentage such as 5% or a fraction such as 0.05")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("expected a percentage such as 5% or a fraction such as 0.05")
    try:
        return float(value)
    except ValueError:
        raise ValueError("expected a percentage such as 5% or a fraction such as 0.05") from None


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
