"""What the tuner keeps for each target across daemon restarts: `TunerMemory`, stored in
<state_dir>/tuning.json by `TuningStore` (written atomically)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from supervisor.atomicfile import LOG_ONLY, StateReport, read_state, write_json
from supervisor.config.schema import Target
from supervisor.models.identity import file_identity
from supervisor.plugin.values import RuntimeInfo
from supervisor.tuning.speedup import Measurement

SPECULATING, BASELINE, OFF = "speculating", "baseline", "off"


@dataclass(frozen=True)
class TunerMemory:
    """What the tuner keeps for a target across restarts of the daemon."""

    fingerprint: str = ""  # the configuration these values belong to
    length: int | None = None  # tuned draft length; None = the configured start
    phase: str = SPECULATING  # speculating | baseline (measuring without) | off
    baseline_tps: float | None = None
    baseline_key: str | None = None  # model file and runtime build the baseline belongs to
    # Server throughput without speculation per load bucket (tuning/mix.py), same key.
    baseline_by_load: dict[str, float] = field(default_factory=dict)
    last_change: float | None = None  # wall clock of the last applied decision
    last_decision: dict[str, Any] | None = None
    # Speedups measured at each length in the current workload regime (JSON keys: str).
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    # The window measured with speculation just before the baseline run, judged as soon
    # as the baseline is known (saves a restart when speculation turns out not to pay).
    before_baseline: dict[str, Any] | None = None
    # The n-gram variant the tuner runs (None: the configured one), and what each variant it
    # tried measured at its tuned length: {variant: {"length": n, "speedup": x}}.
    variant: str | None = None
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Draft length per load bucket, run as one table where the runtime takes one
    # (tuning/by_load.py); {}: one length for every load.
    lengths_by_load: dict[str, int] = field(default_factory=dict)
    # Tables that were run and measured slower than one length (not proposed again until a
    # drift clears the measurements).
    rejected_tables: list[dict[str, int]] = field(default_factory=list)
    # Workload regimes seen before a drift, with what was measured in them, for the day
    # the workload comes back (tuning/regimes.py).
    regimes: list[dict[str, Any]] = field(default_factory=list)
    # Times in a row speculation was turned off (reset when it pays): the re-probe backs off.
    disables: int = 0
    # A drafted step's cost split into fixed and per-token parts [a, b], last fitted on two
    # draft sizes: the runtime's and the machine's, kept across regimes and variants and
    # used where a regime has one length measured (tuning/speedup.fit_cost).
    cost_split: list[float] | None = None
    # The decisions applied, newest last, with what each restart cost (evidence.py).
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def speculation(self) -> bool:
        return self.phase == SPECULATING

    def prior(self) -> tuple[float, float] | None:
        return (self.cost_split[0], self.cost_split[1]) if self.cost_split else None

    def measurements(self) -> dict[int, Measurement]:
        return {int(k): Measurement(**v) for k, v in self.measured.items()}


class TuningStore:
    """<state_dir>/tuning.json: every target's TunerMemory, written atomically. A save that
    cannot be written (a full disk) is reported to `report` and kept here, and written with
    the next save or when `report` retries; a corrupt file is set aside (`read_state`)."""

    def __init__(self, path: Path, report: StateReport = LOG_ONLY) -> None:
        self.path = path
        self.report = report
        self._unsaved: dict[str, dict[str, Any]] = {}

    def load(self, name: str, fingerprint: str) -> TunerMemory:
        """The target's memory, or a fresh one if none is kept or its configuration changed."""
        raw = self._unsaved.get(name) or read_state(self.path, self.report).get(name)
        if not isinstance(raw, dict):
            return TunerMemory(fingerprint)
        try:
            memory = TunerMemory(**raw)
        except TypeError:
            return TunerMemory(fingerprint)
        if memory.fingerprint != fingerprint:
            # Different method, draft or model: tuned lengths do not carry over; a
            # baseline of the same model and runtime does (baseline_key guards it).
            return TunerMemory(fingerprint, baseline_tps=memory.baseline_tps,
                               baseline_key=memory.baseline_key,
                               baseline_by_load=memory.baseline_by_load)
        return memory

    def save(self, name: str, memory: TunerMemory) -> None:
        self._unsaved[name] = asdict(memory)
        self.report.attempt(self.path.name, self._write)

    def _write(self) -> None:
        data = read_state(self.path, self.report)
        data.update(self._unsaved)
        write_json(self.path, data, indent=1)
        self._unsaved.clear()


def fingerprint(target: Target) -> str:
    """The configuration a tuned length belongs to."""
    spec = target.speculation
    return f"{target.backend}|{target.model}|{spec.method}|{spec.variant}|{spec.draft}"


def runtime_key(target: Target, info: RuntimeInfo) -> str:
    """Identity of the model file and the runtime build (file identities, not a hash: cheap).

    A stable string: the tuning store keeps it as `baseline_key`. A path that is not a
    file (a model name the runtime resolves itself) stands for itself.
    """
    parts = [info.version]
    for path in (target.model, info.binary):
        identity = file_identity(path)
        parts.append(str(identity) if identity else path)
    return "|".join(parts)
