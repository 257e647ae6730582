"""What a step costs on this machine: the cost half of the tuner's model.

A step is one forward pass of the target for one request. A plain step yields one token;
a drafted step drafts d tokens, verifies them in one batch and yields 1 + m tokens (m
accepted). Its busy seconds are linear in what it does:

    seconds = t_plain · plain_steps + t_step · drafted_steps + t_draft · draft_tokens
              + t_accept · accepted_tokens

`t_step` is the fixed part of a drafted step (drafting's set-up, the verification batch),
`t_draft` what each drafted token adds (a draft-model decode, a wider batch), `t_accept`
what each accepted token adds (the draft catching up on the tokens it did not draft
itself). Reading the prompt is in the busy seconds too: it is not a term of its own (a
calibration's prompts are alike, so its cost cannot be told from a step's), and falls on
the step terms in proportion (the draft model reads the prompt too, so a drafted step
carries its share of that). The coefficients belong to the machine, the model files, the
runtime build and the load, not to the text: they are fitted by least squares, each at
least 0, from any interval's counters, a calibration's (known acceptance, lengths far
apart: every coefficient is identifiable) and the serving server's alike. Served at one
draft length, `draft_tokens` is k times `drafted_steps` and only their sum is learnt from
it: the fit is a ridge regression pulled towards the calibration, so serving refines what
it can tell apart and leaves the rest.

With several requests running, one step of the server is one batch, and each request in
it waits for the whole batch: a request's plain step beside others' drafts costs what the
batch costs. Summed over an interval that is still the model above (t_plain the step of
a batch without drafts, the drafted terms what each draft adds to its batch, times the
requests that wait for it), but a speculating server's intervals cannot tell t_plain from
the drafted terms: their plain and drafted steps come in the same proportions in every
interval. So the plain step at a load is known only where it was measured without
drafts beside it (`plain_known`): a calibration at that load, steps served with
speculation off, or steps that ran alone (one request running). Elsewhere the fit may
put the plain step anywhere from 0 to the average step of a speculating batch, which on
a CPU under load is several times a step without drafts; against it any length looks
cheap or dear. (docs/tuning.md, "The plain step under load", has what this cost.)
Pure: counts in, coefficients out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

N = 4  # the regressors: plain steps, drafted steps, draft tokens, accepted tokens
NAMES = ("plain", "step", "per_draft", "per_accepted")
# Weight of the pull towards the prior, relative to each term's own evidence: small enough
# to leave what the counts identify, enough to keep an unidentified direction where it was.
RIDGE = 1e-3
PRIOR_COUNT = 100.0  # the prior weighs as this many steps of each term
# Each new interval's statistics count fully, older ones fade with this factor per interval
# (about 2,000 intervals' memory): a build's cost drifts little, a machine's load does.
FORGET = 0.9995
# Plain steps measured without drafts beside them after which a load's plain step is known.
OFF_STEPS = 200.0


@dataclass(frozen=True)
class Interval:
    """What one server did over some busy seconds (a scrape's delta, a calibration cell)."""

    seconds: float
    tokens: float
    drafted_steps: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    prompt_tokens: float = 0.0
    speculating: bool = False

    @property
    def plain_steps(self) -> float:
        # Every step yields one token of the target's own, plus what it accepted.
        return max(0.0, self.tokens - self.drafted_steps - self.accepted_tokens)

    def row(self) -> list[float]:
        return [self.plain_steps, self.drafted_steps, self.draft_tokens, self.accepted_tokens]


@dataclass(frozen=True)
class StepCost:
    """Seconds per step at one load: plain, and a drafted step's parts."""

    plain: float
    step: float
    per_draft: float
    per_accepted: float

    def drafted(self, draft: float, accepted: float) -> float:
        """Seconds of one drafted step of `draft` tokens that accepts `accepted`."""
        return self.step + self.per_draft * draft + self.per_accepted * accepted

    def as_list(self) -> list[float]:
        return [self.plain, self.step, self.per_draft, self.per_accepted]

    def to_dict(self) -> dict[str, float]:
        return {t: round(v, 7) for t, v in zip(NAMES, self.as_list(), strict=True)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepCost:
        return cls(*(float(data.get(k, 0.0)) for k in NAMES))


@dataclass
class CostFit:
    """Normal equations of the regression above, for one load bucket, from what was served;
    `prior` the calibration's coefficients (tuning/calibration.py), scaled by the one
    factor that fits what was served best, then refined by the ridge."""

    prior: StepCost | None = None
    xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * N for _ in range(N)])
    xty: list[float] = field(default_factory=lambda: [0.0] * N)
    steps: float = 0.0  # steps seen, plain and drafted
    seconds: float = 0.0  # and the seconds they took
    # Whether the prior's drafted parts were measured (a calibration at a synthetic
    # acceptance) and only its scale may move; a calibration of the plain step alone guesses
    # them, and then served intervals correct each part without rescaling the plain step.
    shaped: bool = True
    # The plain steps seen with no draft beside them (fading like the rest), and whether
    # the calibration measured this load's plain step itself (not a neighbour's).
    off_steps: float = 0.0
    plain_measured: bool = False

    @property
    def plain_known(self) -> bool:
        """Whether this load's plain step was measured apart from any draft."""
        return self.plain_measured or self.off_steps >= OFF_STEPS

    def add(self, interval: Interval, forget: float = FORGET, alone: bool = False) -> None:
        """Count one interval; `alone`: each of its steps ran as the only request."""
        if interval.seconds <= 0 or interval.tokens <= 0:
            return
        clean = alone or not interval.speculating
        self.off_steps = self.off_steps * forget + (interval.plain_steps if clean else 0.0)
        x = interval.row()
        for i in range(N):
            self.xty[i] = self.xty[i] * forget + x[i] * interval.seconds
            for j in range(N):
                self.xtx[i][j] = self.xtx[i][j] * forget + x[i] * x[j]
        self.steps = self.steps * forget + interval.plain_steps + interval.drafted_steps
        self.seconds = self.seconds * forget + interval.seconds

    def solve(self) -> StepCost | None:
        """The least-squares coefficients, pulled towards the prior (or, with none, towards
        the plain step's cost for every drafted part); None before any step was seen."""
        if self.steps <= 0:
            return self.prior
        prior = self.prior.as_list() if self.prior else None
        if prior is None:
            # No calibration: a plain step at what a step took on average, a drafted one
            # as dear plus half a step per drafted token (a guess the data then corrects).
            plain = self.seconds / self.steps
            prior = [plain, plain, plain / 2, 0.0]
        elif self.shaped:
            # The calibration's shape at the speed the machine has now: the one factor
            # that best explains what was served (a calibration run beside a busy server,
            # or a machine that got busier, is off by a factor, not in shape).
            px = [sum(self.xtx[i][j] * prior[j] for j in range(N)) for i in range(N)]
            norm = sum(prior[i] * px[i] for i in range(N))
            if norm > 0:
                factor = sum(prior[i] * self.xty[i] for i in range(N)) / norm
                prior = [factor * p for p in prior]
        # Each term pulled in proportion to its own evidence (as if the terms were scaled
        # alike), and at least as one interval of PRIOR_COUNT steps would pull it: a term
        # seen little (a few plain steps among thousands drafted) stays near the prior
        # instead of swinging with the noise of its neighbours.
        # Without a calibration the prior is a guess, held only where nothing else is.
        floor = PRIOR_COUNT ** 2 if self.prior is not None else 1e-6
        lam = [max(RIDGE * self.xtx[i][i], floor) for i in range(N)]
        coef = _nonnegative(self.xtx, self.xty, lam, prior)
        # A plain step never costs nothing: at worst a fifth of what the prior says, where
        # few plain steps were seen. Where many were, they say what it costs: the guess
        # without a calibration averages in drafted steps (at 4 requests running, 6x a
        # plain one), and its fifth was above the plain step measured on 768 of them.
        if self.xtx[0][0] < PRIOR_COUNT ** 2:
            coef[0] = max(coef[0], prior[0] / 5)
        return StepCost(*coef)

    def to_dict(self) -> dict[str, Any]:
        return {"prior": self.prior.to_dict() if self.prior else None, "xtx": self.xtx,
                "xty": self.xty, "steps": self.steps, "seconds": self.seconds,
                "shaped": self.shaped, "off_steps": self.off_steps,
                "plain_measured": self.plain_measured}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostFit:
        prior = data.get("prior")
        return cls(StepCost.from_dict(prior) if prior else None,
                   [list(map(float, r)) for r in data["xtx"]], list(map(float, data["xty"])),
                   float(data.get("steps", 0.0)), float(data.get("seconds", 0.0)),
                   bool(data.get("shaped", True)), float(data.get("off_steps", 0.0)),
                   bool(data.get("plain_measured", False)))


def fit(intervals: Sequence[Interval], prior: StepCost | None = None) -> StepCost | None:
    """One cost fitted from `intervals` (a calibration's cells), no forgetting."""
    f = CostFit(prior)
    for iv in intervals:
        f.add(iv, forget=1.0)
    return f.solve()


def _nonnegative(xtx: list[list[float]], xty: list[float], lam: list[float],
                 prior: list[float]) -> list[float]:
    """The ridge fit with every coefficient at least 0: the best over the sets of terms
    left free (the others held at 0), the plain step always free. Clipping the free fit's
    negative coefficients instead is not the best fit with them at 0: n-gram code on an
    AMD EPYC accepts about as many tokens at every n-max, the free fit gave the accepted
    tokens a negative cost, and clipped, it missed every drafted cell by +37 to +58 %
    (this fit: at most 10.1 %)."""
    best: tuple[float, list[float]] | None = None
    for mask in range(1 << (N - 1)):
        free = [0, *(i + 1 for i in range(N - 1) if mask >> i & 1)]
        a = [[xtx[i][j] + (lam[i] if i == j else 0.0) for j in free] for i in free]
        b = [xty[i] + lam[i] * prior[i] for i in free]
        coef = [0.0] * N
        for i, c in zip(free, _solve(a, b), strict=True):
            coef[i] = c
        if any(coef[i] < 0 for i in free[1:]):
            continue
        # The objective less the constant sum of squared seconds.
        loss = sum(coef[i] * (sum(xtx[i][j] * coef[j] for j in range(N)) - 2 * xty[i])
                   + lam[i] * (coef[i] - prior[i]) ** 2 for i in range(N))
        if best is None or loss < best[0]:
            best = (loss, coef)
    assert best is not None  # the plain step alone is always a candidate
    return [max(0.0, c) for c in best[1]]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (4 unknowns; no numpy dependency)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            continue
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(m[r][r]) < 1e-300:
            continue
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x
