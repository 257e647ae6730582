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

# `setting`: OFF is speculation off, a positive number a draft length, None the configured.
OFF = 0


@dataclass(frozen=True)
class TunerMemory:
    """What the tuner keeps for a target across restarts of the daemon."""

    fingerprint: str = ""  # the configuration these values belong to
    # Model files and runtime build the cost belongs to (a new build or file: measured anew).
    runtime_key: str | None = None
    setting: int | None = None
    # The calibration's result (tuning/calibration.py): {"cost", "lengths", "time"}.
    calibration: dict[str, Any] | None = None
    # What the controller learnt (tuning/controller.py `state`): cost fits by load, each
    # class's acceptance, how long each class's stretches last, classes explored.
    learnt: dict[str, Any] = field(default_factory=dict)
    # The decisions applied, newest last, each with its prediction and what its restart
    # cost (tuning/evidence.py).
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def speculation(self) -> bool:
        return self.setting != OFF


class TuningStore:
    """<state_dir>/tuning.json: every target's TunerMemory, written atomically. A save that
    cannot be written (a full disk) is reported to `report` and kept here, and written with
    the next save or when `report` retries; a corrupt file is set aside (`read_state`)."""

    def __init__(self, path: Path, report: StateReport = LOG_ONLY) -> None:
        self.path = path
        self.report = report
        self._unsaved: dict[str, dict[str, Any]] = {}

    def load(self, name: str, fingerprint: str) -> TunerMemory:
        """The target's memory, or a fresh one if none is kept or its configuration changed
        (a file written by an older specfleet, whose tuner kept other things, is one)."""
        raw = self._unsaved.get(name) or read_state(self.path, self.report).get(name)
        if not isinstance(raw, dict):
            return TunerMemory(fingerprint)
        try:
            memory = TunerMemory(**raw)
        except TypeError:
            return TunerMemory(fingerprint)
        if memory.fingerprint != fingerprint:
            # Another method, draft or model: nothing learnt carries over but the plain
            # step's cost of the same files and build, which the calibration holds.
            return TunerMemory(fingerprint)
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
    """The configuration what is learnt belongs to."""
    spec = target.speculation
    return f"{target.backend}|{target.model}|{spec.method}|{spec.variant}|{spec.draft}"


def runtime_key(target: Target, info: RuntimeInfo) -> str:
    """Identity of the model files and the runtime build (file identities, not a hash:
    cheap), and the threads the runtime is given: what a step's cost belongs to.

    A path that is not a file (a model name the runtime resolves itself) stands for itself.
    """
    parts = [info.version]
    for path in (target.model, target.speculation.draft or "", info.binary):
        identity = file_identity(path) if path else None
        parts.append(str(identity) if identity else path)
    parts.append(" ".join(_threads(target.args)) + f" gpus={target.gpus}")
    return "|".join(parts)


def _threads(args: tuple[str, ...]) -> list[str]:
    """The runtime arguments that change a step's cost: threads and GPU offload."""
    out, it = [], iter(args)
    for arg in it:
        if arg.split("=")[0] in ("-t", "--threads", "-ngl", "--gpu-layers", "--n-gpu-layers",
                                 "-tb", "--threads-batch"):
            out.append(arg if "=" in arg else f"{arg}={next(it, '')}")
    return out
