"""The activity list: recent requests through the proxy, for the status page and
`GET /v1/requests` (docs/ui.md). Bounded: the last `size` requests, in memory only.

What a request used is read from what the runtime returned with it: llama.cpp's `timings`
(prompt_n, predicted_n, draft_n, draft_n_accepted, predicted_per_second), else the OpenAI
`usage` block (vLLM; in a stream only when the client asked for it).
"""

from __future__ import annotations

import collections
import json
from typing import Any


def usage_from(tail: bytes) -> dict[str, Any]:
    """Token counts from the end of a response (streamed or not); {} when it has none."""
    text = tail.decode(errors="replace")
    found: dict[str, Any] = {}
    for key in ('"timings"', '"usage"'):
        start = text.rfind(key)
        if start < 0:
            continue
        brace = text.find("{", start)
        block = _object_at(text, brace) if brace >= 0 else None
        if block is None:
            continue
        if key == '"timings"':
            found.update({"prompt_tokens": block.get("prompt_n"),
                          "completion_tokens": block.get("predicted_n"),
                          "draft_tokens": block.get("draft_n"),
                          "accepted_tokens": block.get("draft_n_accepted"),
                          "tokens_per_second": block.get("predicted_per_second")})
        else:
            found.setdefault("prompt_tokens", block.get("prompt_tokens"))
            found.setdefault("completion_tokens", block.get("completion_tokens"))
    return {k: v for k, v in found.items() if isinstance(v, int | float)}


def _object_at(text: str, start: int) -> dict[str, Any] | None:
    """The JSON object that begins at `start` (a flat one: timings and usage are)."""
    end = text.find("}", start)
    if end < 0:
        return None
    try:
        value = json.loads(text[start:end + 1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class RequestLog:
    def __init__(self, size: int = 500) -> None:
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def record(self, target: str, status: int, started: float, duration: float,
               tail: bytes = b"", stream: bool = False, error: str | None = None) -> None:
        entry: dict[str, Any] = {"time": round(started, 3), "target": target,
                                 "status": status, "duration_s": round(duration, 3),
                                 "stream": stream, **usage_from(tail)}
        if "tokens_per_second" not in entry and entry.get("completion_tokens") and duration > 0:
            entry["tokens_per_second"] = entry["completion_tokens"] / duration
        if "tokens_per_second" in entry:
            entry["tokens_per_second"] = round(entry["tokens_per_second"], 2)
        if error:
            entry["error"] = error
        self._entries.append(entry)

    def recent(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Newest first."""
        entries = list(reversed(self._entries))
        return entries[:limit] if limit else entries
