"""The fleet file's `daemon:` keys: the daemon's own settings (state dir, API, proxy, logs,
GPU planning, systemd), and where an API key comes from (`ApiKey`, also a target's key)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from supervisor.config.keyread import read_key
from supervisor.config.measures import parse_size
from supervisor.config.paths import default_state_dir
from supervisor.config.raysettings import RaySettings
from supervisor.config.strict import Bytes, Seconds
from supervisor.config.strict import Strict as _Strict


class ApiKey(_Strict):
    """Where the API key comes from; the key itself never appears in the fleet file or logs.
    Give exactly one of `env` and `file`."""

    env: str | None = Field(default=None, description="Environment variable that holds the key.")
    file: str | None = Field(default=None, description=(
        "File that holds the key; read on every use, so a rotated key needs no restart."))

    @model_validator(mode="after")
    def _exactly_one(self) -> ApiKey:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env: VARIABLE or file: /path/to/key")
        return self

    def read(self, where: str) -> str:
        """The secret itself (config/keyread.py); `where` names the setting in messages."""
        return read_key(self.env, self.file, where)


# What a key may do (docs/api.md, "Keys and scopes"): `read` the status, /v1/targets,
# /metrics, the events and the page without its buttons; `inference` through the proxy;
# `admin` restart, reload and the page's actions (and read: the page shows what it acts on).
Scope = Literal["read", "inference", "admin"]
KEY_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class ScopedKey(ApiKey):
    """A named key of `daemon.keys` and what it grants; its name (never the key) is in the
    request log and in the events of what it did."""

    scopes: tuple[Scope, ...] = Field(min_length=1, description=(
        "What the key may do: `read` (status, `/v1/targets`, `/metrics`, the page without its "
        "buttons), `inference` (the proxy), `admin` (restart, reload, the page's actions; "
        "reading too)."))
    targets: tuple[str, ...] | None = Field(default=None, description=(
        "The targets its `inference` scope covers; unset: every target."))



class GpuSettings(_Strict):
    """VRAM planning and the GPU monitor (docs/gpus.md)."""

    headroom: Bytes = Field(default=1 << 30, description=(
        "Memory the VRAM planner keeps free on every GPU; falling below it is an event."))
    memory: tuple[Annotated[int, BeforeValidator(parse_size), Field(gt=0)], ...] = Field(
        default=(), description=(
            "Memory per GPU (index order) to plan against when NVML cannot read it, such as "
            "`[24GiB, 24GiB]`; empty: read it."))
    interval: Seconds = Field(default=15.0, description=(
        "Time between two readings of the GPU and process monitor."))
    refuse: bool = Field(default=True, description=(
        "Refuse to start a target that does not fit; `false`: warn and start it."))


class SystemdSettings(_Strict):
    """`launcher: systemd` (docs/systemd.md)."""

    scope: Literal["system", "user"] = Field(default="system", description=(
        "The system manager, or the user's (`systemctl --user`)."))
    unit_dir: str | None = Field(default=None, description=(
        "Where unit files are written; unset: `/etc/systemd/system`, or "
        "`~/.config/systemd/user` for scope `user`."))
    watchdog: Seconds = Field(default=30.0, gt=0, description="`WatchdogSec=` of the daemon's own unit.")


def _check_host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT such as 127.0.0.1:9910")
    return value


class Proxy(_Strict):
    """The OpenAI-compatible proxy in front of the targets (docs/api.md)."""

    enabled: bool = Field(default=True, description="Run the proxy.")
    listen: str = Field(default="127.0.0.1:9911", description="`HOST:PORT` the proxy listens on.")
    hold: Seconds = Field(default=120.0, description=(
        "How long a request waits for a restarting target before it fails."))
    drain: Seconds = Field(default=30.0, description=(
        "How long a planned stop of the daemon (SIGTERM: an upgrade, `systemctl restart`) "
        "waits for the proxy's requests under way to finish before it stops the targets; "
        "new connections are refused meanwhile."))

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _check_host_port(value)


# Whether a ModelKit's manifest must carry a trusted key's cosign signature.
VerifyPolicy = Literal["required", "if_present", "off"]


class ModelKitSettings(_Strict):
    """The cache of layers pulled from registries (docs/modelkits.md)."""

    cache: str | None = Field(default=None, description=(
        "Where pulled layers are kept, by digest, shared by every target and daemon restart; "
        "unset: `<state_dir>/modelkits`."))
    max_size: Bytes = Field(default=200 * 1024**3, description=(
        "After each pull, the layers used longest ago are removed beyond this size; never "
        "one a target of the fleet runs."))
    timeout: Seconds = Field(default=30.0, gt=0, description=(
        "A registry that does not answer within this long is taken as down (a start then "
        "uses the digest the tag last resolved to, from the cache)."))
    keys: dict[str, str] = Field(default_factory=dict, description=(
        "Public keys trusted to sign ModelKits (cosign's PEM files: ECDSA P-256, Ed25519 or "
        "RSA), by name; every target with `modelkit.verify` trusts them, and its own "
        "`modelkit.keys` besides (docs/modelkits.md, \"Signed models\")."))
    verify: VerifyPolicy = Field(default="off", description=(
        "Whether a ModelKit's manifest must be signed before its layers are used: `required` "
        "(unsigned, or signed by no trusted key: the target does not start), `if_present` "
        "(a signature that is there must be a trusted key's), or `off`. A target's "
        "`modelkit.verify` overrides it."))


class Daemon(_Strict):
    """The daemon's own settings; they take effect at the next daemon start, not at a reload."""

    state_dir: str = Field(default_factory=default_state_dir, description=(
        "Where `status.json`, `events.jsonl`, `tuning.json`, run records and the lock go: one "
        "daemon per state dir."))
    log_dir: str | None = Field(default=None, description=(
        "Where each target's output goes, as `<target>.log`; unset: `<state_dir>/logs`."))
    api: str = Field(default="127.0.0.1:9910", description=(
        "`HOST:PORT` of the HTTP API and the Prometheus `/metrics` (docs/api.md)."))
    api_token: ApiKey | None = Field(default=None, description=(
        "Bearer token of the API and the proxy (all but `/healthz`), with every scope (a key "
        "named `api_token`); a token or keys are required when either listens beyond "
        "loopback; neither: no authentication."))
    keys: dict[Annotated[str, Field(pattern=KEY_NAME)], ScopedKey] = Field(
        default_factory=dict, description=(
            "Named keys, each with its scopes (`{file: PATH, scopes: [read]}`); re-read on "
            "every use, so a rotated key needs no restart (docs/api.md)."))
    proxy: Proxy = Field(default=Proxy(), description="The OpenAI-compatible proxy.")
    log_max_bytes: Bytes = Field(default=10 * 1024 * 1024, description=(
        "Size at which a target's log is rotated; `0`: never."))
    log_backups: int = Field(default=3, ge=0, le=100, description="Rotated logs kept per target.")
    gpu: GpuSettings = Field(default=GpuSettings(), description="VRAM planning and the GPU monitor.")
    systemd: SystemdSettings = Field(default=SystemdSettings(), description=(
        "The systemd launcher and the daemon's own unit."))
    ray: RaySettings = Field(default=RaySettings(), description=(
        "The Ray cluster of `launcher: ray` targets (docs/ray.md)."))
    modelkits: ModelKitSettings = Field(default=ModelKitSettings(), description=(
        "The cache of models pulled from registries (`modelkit:` on a target)."))
    stop_targets_on_exit: bool = Field(default=False, description=(
        "SIGTERM of the daemon also stops targets run by systemd or Ray (process targets "
        "always stop with it); `false`, so that a daemon restart does not reload models."))

    @field_validator("api")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _check_host_port(value)

    @property
    def modelkit_cache(self) -> Path:
        return Path(self.modelkits.cache or Path(self.state_dir) / "modelkits").expanduser()

    @property
    def logs(self) -> Path:
        return Path(self.log_dir) if self.log_dir else Path(self.state_dir) / "logs"
