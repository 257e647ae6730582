"""Fleet file schema, version 1, as frozen pydantic models.

Every knob has the default a sysadmin would pick; the defaults are documented in
docs/fleet-file.md. Models are frozen so that a reload can compare a target's old
and new definition with `==` and restart only what changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from supervisor.config.units import parse_duration, parse_fraction, parse_size
from supervisor.errors import SpecfleetError

Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Fraction = Annotated[float, BeforeValidator(parse_fraction), Field(ge=0, le=1)]
Bytes = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]

# eagle (EAGLE-1/2) and suffix (suffix decoding) exist in vLLM only; backends refuse what
# their runtime lacks, in `specfleet check`.
METHODS = ("none", "draft", "eagle", "eagle3", "mtp", "dflash", "ngram", "suffix")
NGRAM_VARIANTS = ("mod", "simple", "map-k", "map-k4v", "cache")
# Methods whose drafts come from a separate file; MTP may use layers inside the target.
METHODS_NEEDING_DRAFT = ("draft", "eagle", "eagle3", "dflash")
METHODS_WITH_DRAFT_FILE = ("draft", "eagle", "eagle3", "dflash", "mtp")
METHODS_WITHOUT_MODEL = ("ngram", "suffix")  # draft from the context
LAUNCHERS = ("process", "systemd", "external")


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/specfleet"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "specfleet")


def _argv_item(value: Any) -> Any:
    # `args: [-ngl, 99]` is natural YAML; the 99 arrives as an int.
    if isinstance(value, list):
        return [str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for v in value]
    return value


def _env_values(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for k, v in value.items()}
    return value


def _gpus(value: Any) -> Any:
    if value is None or value in ("all", "none"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return tuple(value)
    raise ValueError("expected a GPU index, a list of indices such as [0, 1], 'all' or 'none'")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Length(_Strict):
    """Draft length (tokens drafted per step): where to start and the bounds the tuner keeps to."""

    start: int | None = Field(default=None, ge=0, le=1024)
    min: int = Field(default=1, ge=0, le=1024)
    max: int | None = Field(default=None, ge=1, le=1024)


class Speculation(_Strict):
    method: Literal["none", "draft", "eagle", "eagle3", "mtp", "dflash", "ngram", "suffix"] = "none"
    variant: Literal["mod", "simple", "map-k", "map-k4v", "cache"] | None = None
    draft: str | None = None
    length: Length = Length()


class ApiKey(_Strict):
    """Where the API key comes from; the key itself never appears in the fleet file or logs."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ApiKey:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env: VARIABLE or file: /path/to/key")
        return self

    def read(self, where: str) -> str:
        """The secret itself; `where` names the setting in the message when it is missing.
        Read on every use, so a rotated key file takes effect without a restart."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise SpecfleetError(f"{where}.env names {self.env}, which is not set")
            return value
        try:
            return Path(str(self.file)).expanduser().read_text().strip()
        except OSError as exc:
            raise SpecfleetError(f"cannot read {where}.file {self.file}: {exc.strerror}") from exc


class Restart(_Strict):
    backoff_initial: Seconds = 2.0
    backoff_max: Seconds = 300.0
    backoff_multiplier: float = Field(default=2.0, ge=1.0, le=10.0)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    max_crashes: int = Field(default=5, ge=1, le=1000)
    window: Seconds = 600.0
    stop_grace: Seconds = 15.0


class Health(_Strict):
    interval: Seconds = 5.0
    timeout: Seconds = Field(default=5.0, gt=0)
    failures: int = Field(default=3, ge=1, le=100)
    start_timeout: Seconds = 600.0
    metrics_interval: Seconds = 15.0


class Tuning(_Strict):
    """Draft-length autotuning (docs/tuning.md). A retune is a restart of the server."""

    enabled: bool = True
    min_gain: Fraction = 0.05  # retune only for a predicted gain of at least 5 %
    off_margin: Fraction = 0.03  # speculation must beat "off" by 3 % to stay on
    cooldown: Seconds = 900.0  # between two changes, unless acceptance drifted
    reprobe: Seconds = 3600.0  # after turning speculation off, try it again
    max_wait: Seconds = 600.0  # wait this long for an idle server before applying anyway
    min_steps: int = Field(default=200, ge=1)  # verification steps of evidence per decision
    min_tokens: int = Field(default=1000, ge=1)  # tokens served before (and for) a baseline
    window_steps: int = Field(default=4000, ge=10)  # acceptance window size
    drift_threshold: float = Field(default=1.5, gt=0)  # Page-Hinkley threshold


class TargetDefaults(_Strict):
    """Keys under `defaults:`; every target inherits them (mappings merge key by key)."""

    backend: str | None = None
    launcher: Literal["process", "systemd", "external"] | None = None
    host: str | None = None
    gpus: Annotated[tuple[int, ...] | Literal["all", "none"] | None, BeforeValidator(_gpus)] = None
    speculation: Speculation | None = None
    args: Annotated[tuple[str, ...], BeforeValidator(_argv_item)] = ()
    env: Annotated[dict[str, str], BeforeValidator(_env_values)] = Field(default_factory=dict)
    binary: str | None = None
    api_key: ApiKey | None = None
    restart: Restart | None = None
    health: Health | None = None
    tuning: Tuning | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class Target(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    backend: str = "llamacpp"
    launcher: Literal["process", "systemd", "external"] = "process"
    model: str
    speculation: Speculation = Speculation()
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    gpus: Annotated[tuple[int, ...] | Literal["all", "none"] | None, BeforeValidator(_gpus)] = None
    args: Annotated[tuple[str, ...], BeforeValidator(_argv_item)] = ()
    env: Annotated[dict[str, str], BeforeValidator(_env_values)] = Field(default_factory=dict)
    binary: str | None = None
    api_key: ApiKey | None = None
    restart: Restart = Restart()
    health: Health = Health()
    tuning: Tuning = Tuning()
    # Backend-specific settings, checked by the backend (e.g. vLLM's prompt_lookup_min,
    # Ollama's models_dir); see each backend in README.md.
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def probe_host(self) -> str:
        """Where to connect: a wildcard bind is reachable on loopback."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "", "*") else (
            "::1" if self.host == "::" else self.host)

    @property
    def base_url(self) -> str:
        host = self.probe_host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


class GpuSettings(_Strict):
    """VRAM planning and the GPU monitor (docs/gpus.md)."""

    headroom: Bytes = 1 << 30  # keep this much free on every GPU
    # Memory per GPU (index order) to plan against when NVML cannot read it; empty: read it.
    memory: tuple[Annotated[int, BeforeValidator(parse_size), Field(gt=0)], ...] = ()
    interval: Seconds = 15.0  # between two readings of the monitor
    refuse: bool = True  # refuse a target that does not fit (false: warn and start it)


class SystemdSettings(_Strict):
    """`launcher: systemd` (docs/systemd.md)."""

    scope: Literal["system", "user"] = "system"
    unit_dir: str | None = None  # default /etc/systemd/system, or ~/.config/systemd/user
    watchdog: Seconds = Field(default=30.0, gt=0)  # WatchdogSec= of the daemon's own unit


def _check_host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT such as 127.0.0.1:9910")
    return value


class Proxy(_Strict):
    """The OpenAI-compatible proxy in front of the targets (docs/api.md)."""

    enabled: bool = True
    listen: str = "127.0.0.1:9911"
    hold: Seconds = 120.0  # how long a request waits for a restarting target

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _check_host_port(value)


class Daemon(_Strict):
    state_dir: str = Field(default_factory=default_state_dir)
    log_dir: str | None = None  # default: <state_dir>/logs
    api: str = "127.0.0.1:9910"
    # Bearer token for the API and the proxy (everything but /healthz); required when either
    # listens beyond loopback.
    api_token: ApiKey | None = None
    proxy: Proxy = Proxy()
    log_max_bytes: Bytes = 10 * 1024 * 1024
    log_backups: int = Field(default=3, ge=0, le=100)
    gpu: GpuSettings = GpuSettings()
    systemd: SystemdSettings = SystemdSettings()
    # SIGTERM of the daemon also stops targets run by systemd (process-launcher targets always
    # stop with the daemon). Default false: a daemon restart or upgrade must not reload models.
    stop_targets_on_exit: bool = False

    @field_validator("api")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _check_host_port(value)

    @property
    def logs(self) -> Path:
        return Path(self.log_dir) if self.log_dir else Path(self.state_dir) / "logs"


class Fleet(_Strict):
    version: Literal[1]
    daemon: Daemon = Daemon()
    defaults: TargetDefaults = TargetDefaults()
    targets: dict[str, Target] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _inherit_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("targets"), dict):
            return data
        defaults = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
        targets = {}
        for name, raw in data["targets"].items():
            if isinstance(raw, dict):
                raw = {"name": name, **merge(defaults, raw)}
            targets[name] = raw
        return {**data, "targets": targets}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `over` replaces `base`."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
