"""The activity list: recent requests through the proxy, for the status page and
`GET /v1/requests` (docs/ui.md). Bounded: the last `size` requests, in memory only.

What a request used is read from what the runtime returned at the end of its response,
as the proxy found it: the OpenAI `usage` block for the prompt (`prompt_tokens`: the whole
prompt, as clients count it) and llama.cpp's `timings` for the rest (predicted_n, draft_n,
draft_n_accepted, predicted_per_second; `cache_n`: prompt tokens served from the cache, for
which `prompt_n` does not count them). Where `usage` is missing (a stream that did not ask
for it) the prompt is prompt_n + cache_n.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any


def counts(final: Mapping[str, Any] | None) -> dict[str, float]:
    """What a request used, from the object at the end of its response (the proxy finds it)."""
    if final is None:
        return {}
    found: dict[str, Any] = {}
    if isinstance(timings := final.get("timings"), dict):
        cached, evaluated = timings.get("cache_n"), timings.get("prompt_n")
        found = {"prompt_tokens": evaluated + cached if isinstance(evaluated, int)
                 and isinstance(cached, int) else evaluated,
                 "cached_tokens": cached,
                 "completion_tokens": timings.get("predicted_n"),
                 "draft_tokens": timings.get("draft_n"),
                 "accepted_tokens": timings.get("draft_n_accepted"),
                 "tokens_per_second": timings.get("predicted_per_second")}
    if isinstance(usage := final.get("usage"), dict):
        if isinstance(usage.get("prompt_tokens"), int):
            found["prompt_tokens"] = usage["prompt_tokens"]
        found.setdefault("completion_tokens", usage.get("completion_tokens"))
    return {k: v for k, v in found.items() if isinstance(v, int | float)}


class RequestLog:
    def __init__(self, size: int = 500) -> None:
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def record(self, target: str, status: int, started: float, duration: float,
               stream: bool = False, final: Mapping[str, Any] | None = None,
               error: str | None = None, key: str | None = None) -> None:
        entry: dict[str, Any] = {"time": round(started, 3), "target": target,
                                 "status": status, "duration_s": round(duration, 3),
                                 "stream": stream, **counts(final)}
        if key is not None:
            entry["key"] = key  # the key's name: who asked (never the key)
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
