"""Workload regimes the tuner has seen before: what a search found, kept for the return.

A drift of acceptance means the workload changed, and the speedups measured before it
describe a workload that is gone, so the tuner forgets them and searches again. But
workloads come back (code in working hours, chat in the evening; the benchmark's
code → prose → code), and searching again costs a restart per candidate. So at a drift
the outgoing regime is kept: the acceptance rate judged at each setting that ran in it,
with what was measured (speedups by length, results by n-gram variant). When, after a
later drift, the acceptance at the setting running then is within `TOLERANCE` of a kept
regime's at that same setting, the regime's measurements come back and the search resumes
from them instead of from nothing: straight to the regime's best setting, or it stays.

A regime also keeps the share of greedy requests it had (tuning/sampling.py). When that
share changes for good, the workload changed before a single token shows it, even with
speculation off; a kept regime whose share is within `SHARE_TOLERANCE` of the new one (the
closest, the most recently seen on a tie) is recalled at once.

Acceptance is compared only at the same setting (variant and length): it depends on the
setting as much as on the text. A regime that matches a kept one at a setting both saw,
with the same sampling, is the same regime (the newer replaces the older). Two regimes whose
shares of greedy requests differ are not, whatever acceptance they share: a drift the
sampling shows late leaves the new workload's first judgements in the old regime (run 16 of
tuner_phases: prose's length 2 judged at 0.18 before the sampling changed was booked to code,
and prose's own 0.13 at length 2 then replaced the code regime, which never came back).
A change of sampling that shows after a drift of the tokens already left a regime for it
is the same change: that regime is given the old share (`relabel`), and nothing is left
again (run 18: prose's numbers were booked under code's share and recalled as code's).
At most `LIMIT` are kept, the least recently seen dropped first. The functions are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The drift detector ignores changes under 5 points of acceptance and needs a far larger
# step to fire quickly; regimes closer than 8 points are not told apart.
TOLERANCE = 0.08
LIMIT = 4
# Shares of greedy requests closer than this are the same sampling: an all-greedy workload
# and an all-sampled one are 1.0 apart, and the share is estimated from a few requests
# right after the change (5: the detector's least evidence).
SHARE_TOLERANCE = 0.2

# acceptance {setting: rate}, variant, measured, variants, seen (JSON-ready)
Regime = Mapping[str, Any]


def setting_key(variant: str | None, length: int | None) -> str:
    """The setting acceptance was seen at, e.g. "mod:16"; "default" for a runtime default."""
    return f"{variant or '-'}:{length if length is not None else 'default'}"


def remember(regimes: Sequence[Regime], acceptance: Mapping[str, float], variant: str | None,
             measured: Mapping[str, Any], variants: Mapping[str, Any],
             now: float, greedy_share: float | None = None) -> list[dict[str, Any]]:
    """The kept regimes with this one added (kept ones it matches are replaced); nothing is
    added when nothing was judged or measured in it. `measured`: speedups by length of
    `variant`, the one running at the drift; `variants`: results by variant;
    `greedy_share`: of its requests that came through the proxy with a temperature."""
    if not acceptance or not (measured or variants):
        return [dict(r) for r in regimes]
    kept = [dict(r) for r in regimes
            if not (_same_sampling(r, greedy_share)
                    and any(_matches(r, k, rate) for k, rate in acceptance.items()))]
    kept.append({"acceptance": {k: round(v, 4) for k, v in acceptance.items()},
                 "variant": variant, "measured": dict(measured), "variants": dict(variants),
                 "seen": now, "greedy_share": None if greedy_share is None
                 else round(greedy_share, 4)})
    kept.sort(key=lambda r: r["seen"])
    return kept[-LIMIT:]


def recall(regimes: Sequence[Regime], setting: str, acceptance: float) -> Regime | None:
    """The kept regime this acceptance at this setting matches (the closest), if any."""
    matches = [r for r in regimes if _matches(r, setting, acceptance)]
    return min(matches, key=lambda r: abs(r["acceptance"][setting] - acceptance), default=None)


def recall_sampled(regimes: Sequence[Regime], greedy_share: float) -> Regime | None:
    """The kept regime whose share of greedy requests this one matches (the closest, the
    most recently seen on a tie), if any."""
    shares = {i: float(r["greedy_share"]) for i, r in enumerate(regimes)
              if isinstance(r.get("greedy_share"), int | float)
              and abs(float(r["greedy_share"]) - greedy_share) <= SHARE_TOLERANCE}
    if not shares:
        return None
    best = min(shares, key=lambda i: (abs(shares[i] - greedy_share), -float(regimes[i]["seen"])))
    return regimes[best]


def relabel(regimes: Sequence[Regime], seen: float, greedy_share: float | None
            ) -> list[dict[str, Any]]:
    """The kept regimes with the one left at `seen` given this share of greedy requests (a
    change of sampling that showed after the drift of the tokens that left it); the share
    unknown leaves it as it was."""
    return [dict(r, greedy_share=round(greedy_share, 4))
            if r.get("seen") == seen and greedy_share is not None else dict(r) for r in regimes]


def _same_sampling(regime: Regime, greedy_share: float | None) -> bool:
    """Whether the regime's share of greedy requests is this one's (unknown on either side:
    nothing says otherwise)."""
    share = regime.get("greedy_share")
    return not isinstance(share, int | float) or greedy_share is None or \
        abs(float(share) - greedy_share) <= SHARE_TOLERANCE


def _matches(regime: Regime, setting: str, acceptance: float) -> bool:
    seen = regime.get("acceptance", {})
    return isinstance(seen, Mapping) and setting in seen and \
        abs(float(seen[setting]) - acceptance) <= TOLERANCE
