"""The quantities specfleet shows for a target, computed in one place.

`specfleet status`, `/v1/targets` and `/metrics` all read what `shown()` returns, so
they cannot disagree. The source is the tuning window (recent evidence, cleared at each
configuration change) when it holds any, else the runtime's cumulative counters.

Mean accepted length is tokens per verification step that carried a draft, counting
the target's own token: 1 + accepted / drafts (vLLM's "mean acceptance length"; 1.0
means no draft token was ever accepted).
"""

from __future__ import annotations

from typing import Any

from supervisor.plugin.backend import MetricsSample
from supervisor.tuning.numbers import rounded
from supervisor.tuning.window import WindowStats


def shown(window: WindowStats | None, counters: MetricsSample | None, *, method: str,
          speculating: bool, draft_length: int | None, serving: bool = True) -> dict[str, Any]:
    """Acceptance rate, mean accepted length, tokens/s and the draft length in effect
    (0: speculation turned off by the tuner; None: no speculation, or a length nobody
    knows). A target that does not serve shows no rates: what it measured belongs to a
    process that is gone or not ready, and would read as current."""
    if not serving:
        window, counters = None, None
    if window is not None and window.tokens:
        source, drafts, accepted = "window", window.drafts, window.accepted
        rate, tps = window.acceptance_rate, window.tokens_per_second
    elif counters is not None:
        source, drafts, accepted = "counters", counters.drafts, counters.accepted_tokens
        rate, tps = counters.acceptance_rate, counters.tokens_per_second
    else:
        source, drafts, accepted, rate, tps = "none", 0, 0, None, None
    length = None if method == "none" else (draft_length if speculating else 0)
    return {"source": source, "drafts": drafts,
            "acceptance_rate": rounded(rate) if drafts else None,
            "mean_accepted_length": rounded(1 + accepted / drafts) if drafts else None,
            "tokens_per_second": rounded(tps, 2) if tps else None,
            "draft_length": length}
