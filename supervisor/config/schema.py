"""Fleet file schema, version 1, as frozen pydantic models.

Every knob has the default a sysadmin would pick; the defaults are documented in
docs/fleet-file.md. Models are frozen so that a reload can compare a target's old
and new definition with `==` and restart only what changed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from supervisor.config import ociref
from supervisor.config.containersettings import ContainerSettings
from supervisor.config.daemonsettings import ApiKey, Daemon, VerifyPolicy
from supervisor.config.ondemandsettings import LoadingDefaults, LoadingKeys
from supervisor.config.raysettings import RayPlacement
from supervisor.config.scalars import env_name
from supervisor.config.strict import Fraction, Seconds
from supervisor.config.strict import Strict as _Strict

# NVML numbers a host's GPUs from 0; no host has a thousand.
MAX_GPU_INDEX = 1023

# eagle (EAGLE-1/2) and suffix (suffix decoding) exist in vLLM only; backends refuse what
# their runtime lacks, in `specfleet check`.
Method = Literal["none", "draft", "eagle", "eagle3", "mtp", "dflash", "ngram", "suffix"]
NgramVariant = Literal["mod", "simple", "map-k", "map-k4v", "cache"]
# Methods whose drafts come from a separate file; MTP may use layers inside the target.
METHODS_NEEDING_DRAFT = ("draft", "eagle", "eagle3", "dflash")
METHODS_WITH_DRAFT_FILE = ("draft", "eagle", "eagle3", "dflash", "mtp")
METHODS_WITHOUT_MODEL = ("ngram", "suffix")  # draft from the context
# Launchers are plugins (the registry checks the name against those installed); this is
# the fleet file's default, the one launcher named outside supervisor/launcher/.
DEFAULT_LAUNCHER = "process"


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


Environment = Annotated[dict[Annotated[str, AfterValidator(env_name)], str],
                        BeforeValidator(_env_values)]


def _gpus(value: Any) -> Any:
    if value is None or value in ("all", "none"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                       and 0 <= v <= MAX_GPU_INDEX for v in value):
        return tuple(value)
    raise ValueError(f"expected a GPU index from 0 to {MAX_GPU_INDEX}, a list of indices such as "
                     "[0, 1], 'all' or 'none'")


class Length(_Strict):
    """Draft length (tokens drafted per step): where to start and the bounds the tuner keeps to."""

    start: int | None = Field(default=None, ge=0, le=1024, description=(
        "Draft length at the start; unset: the runtime's own default for the method."))
    min: int = Field(default=1, ge=0, le=1024, description="Shortest draft length the tuner may choose.")
    max: int | None = Field(default=None, ge=1, le=1024, description=(
        "Longest draft length the tuner may choose; unset: the backend's ceiling for the method."))


class Speculation(_Strict):
    """Speculative decoding: where the drafts come from and how many tokens one step drafts."""

    method: Method = Field(
        default="none", description=(
            "Where drafts come from: nowhere, a draft model, a head (`eagle`, `eagle3`, `mtp`, "
            "`dflash`) or the context (`ngram`, `suffix`); `eagle` and `suffix` are vLLM only."))
    variant: NgramVariant | None = Field(
        default=None, description="The n-gram variant, for method `ngram` only; unset: `mod`.")
    variants: tuple[NgramVariant, ...] | Literal["auto"] | None = Field(
        default=None, description=(
            "N-gram variants the tuner may switch between (method `ngram`, runtimes that have "
            "variants: llama.cpp); `auto`: every variant whose length it can tune; unset: only "
            "`variant`. Checked, but not acted on yet: the model tuner tunes the length of "
            "`variant` only (docs/tuning.md, \"What is gone, and why\")."))
    draft: str | None = Field(default=None, description=(
        "Draft model or head file: required for `draft`, `eagle`, `eagle3` and `dflash`, "
        "optional for `mtp`, refused for `ngram` and `suffix`."))
    length: Length = Field(default=Length(), description="Draft length: start value and the tuner's bounds.")


def _reference(value: str) -> str:
    try:
        ociref.parse(value)
    except ociref.ReferenceError as exc:  # it says what is wrong and what is valid
        raise ValueError(str(exc)) from None
    return value.strip()


def _modelkit(value: Any) -> Any:
    return {"ref": value} if isinstance(value, str) else value  # `modelkit: HOST/REPO:TAG`


class ModelKit(_Strict):
    """A target's model, and its draft, from one KitOps ModelKit or CNCF ModelPack in an OCI
    registry (docs/modelkits.md)."""

    ref: Annotated[str, AfterValidator(_reference)] = Field(description=(
        "The artifact: `HOST[:PORT]/REPOSITORY[:TAG]` or `...@sha256:DIGEST`; https, but plain "
        "http to a registry on loopback. A tag is resolved at each daemon start and reload."))
    draft: str | None = Field(default=None, description=(
        "The part that is the draft: its Kitfile name or file name; unset: the only GGUF part "
        "besides the model. Used where `speculation.method` takes a draft file and "
        "`speculation.draft` is unset."))
    verify: VerifyPolicy | None = Field(default=None, description=(
        "Whether its manifest must carry a trusted key's signature (`required`, "
        "`if_present`, `off`); unset: `daemon.modelkits.verify`."))
    keys: dict[str, str] = Field(default_factory=dict, description=(
        "Public keys (PEM files, by name) trusted for this target besides "
        "`daemon.modelkits.keys`."))


class Restart(_Strict):
    """Crash handling: restarts with exponential backoff, and giving up on a crash loop."""

    backoff_initial: Seconds = Field(default=2.0, description=(
        "Delay before the first restart; each further crash within `window` multiplies it. "
        "Also the first delay before a target `waiting` for what the host lacks (a file, a "
        "binary, its port) looks again, doubling to at most 10 s."))
    backoff_max: Seconds = Field(default=300.0, description="Longest delay before a restart.")
    backoff_multiplier: float = Field(default=2.0, ge=1.0, le=10.0, description=(
        "Factor by which the delay grows with each recent crash."))
    jitter: float = Field(default=0.2, ge=0.0, le=1.0, description=(
        "Random spread of each delay (0.2: ±20 %), so targets that crashed together do not "
        "restart together."))
    max_crashes: int = Field(default=5, ge=1, le=1000, description=(
        "This many crashes within `window` and the target is `failed` (given up on)."))
    window: Seconds = Field(default=600.0, description="Span over which crashes are counted.")
    stop_grace: Seconds = Field(default=15.0, description=(
        "Stopping: SIGTERM to the server's process group, this long, then SIGKILL."))
    replace: Literal["auto", "beside", "in_place"] = Field(default="auto", description=(
        "How a planned restart (a retune, a restart through the API) replaces a running server. "
        "`beside`: the new server starts on another port beside the old one, takes the proxy's "
        "new requests once it is ready, and the old one finishes what it has, then stops; "
        "only where the launcher can run two at once (`process`) and memory holds both (the "
        "VRAM plan on a GPU, host memory on the CPU), else in place. `in_place`: stop, then "
        "start on the same port. `auto`: `beside` when the daemon's proxy is on (clients reach "
        "the target through it: the runtime's own port changes at each such restart), "
        "`in_place` when it is off (docs/tuning.md)."))


class Health(_Strict):
    """Readiness and liveness probes, and how often the runtime's counters are read."""

    interval: Seconds = Field(default=5.0, description=(
        "Time between two probes (0.5 s while the model loads); must be above 0."))
    timeout: Seconds = Field(default=5.0, gt=0, description="A probe slower than this counts as failed.")
    failures: int = Field(default=3, ge=1, le=100, description=(
        "Failed probes in a row, while the process is alive and uses no CPU, after which it is "
        "declared hung, killed and restarted; a busy server whose CPU time advances is not."))
    start_timeout: Seconds = Field(default=600.0, description=(
        "A server still loading after this long has failed to start."))
    metrics_interval: Seconds = Field(default=15.0, description=(
        "Time between two reads of the runtime's acceptance counters."))


class Tuning(_Strict):
    """Draft-length autotuning (docs/tuning.md). A retune is a restart of the server."""

    enabled: bool = Field(default=True, description=(
        "Tune the draft length, and turn speculation off where it does not pay."))
    min_gain: Fraction = Field(default=0.05, description=(
        "The least share of busy time a switch must be sure to save (the lower bound of its "
        "predicted gain) before it is made; it must also pay for its restart over the busy "
        "time the current mix of requests is expected to last."))
    max_wait: Seconds = Field(default=600.0, description=(
        "How long a retune waits for an idle server before it is applied anyway (a restart "
        "beside the old server does not wait)."))
    min_steps: int = Field(default=200, ge=1, le=10_000_000, description=(
        "Drafted steps of a class of requests below which its acceptance counts as unknown: "
        "a mix of such classes served without speculation is tried with it once."))
    window_steps: int = Field(default=4000, ge=10, le=10_000_000, description=(
        "Size of the acceptance window shown by status, in verification steps."))
    off_margin: Fraction = Field(default=0.03, description=(
        "Ignored since the tuner predicts from a calibrated cost (docs/tuning.md); accepted so "
        "that fleet files which set it still load."))
    cooldown: Seconds = Field(default=900.0, description=(
        "Ignored since the tuner predicts from a calibrated cost: a switch must pay for its "
        "restart instead. Accepted so that fleet files which set it still load."))
    reprobe: Seconds = Field(default=3600.0, description=(
        "Ignored since the tuner predicts from a calibrated cost: speculation comes back on "
        "when the mix predicts it pays. Accepted so that fleet files which set it still load."))
    min_tokens: int = Field(default=1000, ge=1, le=1_000_000_000, description=(
        "Tokens a drafter that learns across requests (llama.cpp's ngram-mod) serves after "
        "each start before what it accepts counts: it starts empty and accepts less at first."))
    drift_threshold: float = Field(default=1.5, gt=0, le=1000, description=(
        "Ignored since each class's acceptance fades with a half-life instead. Accepted so "
        "that fleet files which set it still load."))


class TargetDefaults(LoadingDefaults):
    """Keys under `defaults:`; every target inherits them (mappings merge key by key)."""

    backend: str | None = None
    launcher: str | None = None
    host: str | None = None
    gpus: Annotated[tuple[int, ...] | Literal["all", "none"] | None, BeforeValidator(_gpus)] = None
    speculation: Speculation | None = None
    args: Annotated[tuple[str, ...], BeforeValidator(_argv_item)] = ()
    env: Environment = Field(default_factory=dict)
    binary: str | None = None
    api_key: ApiKey | None = None
    restart: Restart | None = None
    health: Health | None = None
    tuning: Tuning | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    launcher_settings: dict[str, Any] = Field(default_factory=dict)
    ray: RayPlacement | None = None
    container: ContainerSettings | None = None


class Target(LoadingKeys):
    """One LLM server: a runtime (the backend) serving one model on one port."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", description=(
        "Not written: the target's name is its key under `targets:`; letters, digits, `.`, `_` "
        "and `-`, starting with a letter or digit, at most 63 characters."))
    backend: str = Field(default="llamacpp", description=(
        "The backend plugin that runs it: `llamacpp`, `vllm`, `ollama` or a third-party one; "
        "`specfleet check` lists those installed."))
    launcher: str = Field(default=DEFAULT_LAUNCHER, description=(
        "How it runs. `process`: a child of the daemon; `systemd`: the unit "
        "`specfleet-<name>.service`; `external`: a server already running (Ollama), specfleet "
        "manages only its model; `ray`: a detached actor on a node of the Ray cluster "
        "(docs/ray.md); `container`: a podman or docker container of `container.image` "
        "(docs/containers.md); or a third-party launcher (docs/plugins.md). `specfleet check` "
        "names those installed."))
    model: str = Field(default="", description=(
        "The model the runtime serves: a GGUF file for llama.cpp; for vLLM and Ollama also a "
        "model directory, repo id or tag. Required unless `modelkit` names it."))
    modelkit: Annotated[ModelKit | None, BeforeValidator(_modelkit)] = Field(
        default=None, description=(
            "The model (and the draft) from a registry instead: a reference, or `{ref, "
            "draft}`; pulled into the daemon's cache, verified by digest (docs/modelkits.md)."))
    speculation: Speculation = Field(default=Speculation(), description=(
        "Speculative decoding: method, draft file and draft length."))
    host: str = Field(default="127.0.0.1", description=(
        "Address the server binds; `0.0.0.0` exposes it beyond this machine (then set `api_key`)."))
    port: int = Field(ge=1, le=65535, description=(
        "Port the server listens on; every target needs its own."))
    gpus: Annotated[tuple[int, ...] | Literal["all", "none"] | None, BeforeValidator(_gpus)] = Field(
        default=None, description=(
            "GPUs, as `CUDA_VISIBLE_DEVICES`: an index, a list of indices, `all`, or `none` (CPU "
            "only); unset: the VRAM planner places it."))
    args: Annotated[tuple[str, ...], BeforeValidator(_argv_item)] = Field(default=(), description=(
        "Extra runtime arguments, appended last; flags specfleet sets itself are refused."))
    env: Environment = Field(
        default_factory=dict, description="Extra environment variables of the server.")
    binary: str | None = Field(default=None, description=(
        "The runtime executable; unset: the backend's command on PATH (llama.cpp: then "
        "specfleet's cache). With `launcher: container`, the command inside the image "
        "(unset: the backend's command, such as `llama-server`, on the image's PATH)."))
    api_key: ApiKey | None = Field(default=None, description=(
        "API key the server demands, passed by environment (never in argv); unset: none."))
    restart: Restart = Field(default=Restart(), description="What happens after a crash.")
    health: Health = Field(default=Health(), description="Health probes and counter reads.")
    tuning: Tuning = Field(default=Tuning(), description="Draft-length autotuning.")
    options: dict[str, Any] = Field(default_factory=dict, description=(
        "Backend-specific settings, checked by the backend (README.md, backend options)."))
    launcher_settings: dict[str, Any] = Field(default_factory=dict, description=(
        "A third-party launcher's settings, checked against the model the launcher declares "
        "(docs/plugins.md, `Launcher.settings`); the built-in launchers have their own "
        "sections (`ray:`, `container:`)."))
    ray: RayPlacement = Field(default=RayPlacement(), description=(
        "`launcher: ray` only: the nodes and Ray resources the target may use."))
    container: ContainerSettings = Field(default=ContainerSettings(), description=(
        "`launcher: container` only: the image and how the engine runs it."))

    @property
    def probe_host(self) -> str:
        """Where to connect: a wildcard bind is reachable on loopback."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "", "*") else (
            "::1" if self.host == "::" else self.host)

    @property
    def base_url(self) -> str:
        host = self.probe_host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


class Fleet(_Strict):
    """A fleet file: its version, the daemon's settings, defaults for targets, the targets."""

    version: Literal[1] = Field(description="The schema version; `1` is the only one.")
    daemon: Daemon = Field(default=Daemon(), description="The daemon's own settings.")
    defaults: TargetDefaults = Field(default=TargetDefaults(), description=(
        "Keys every target inherits; a target's own value wins."))
    targets: dict[str, Target] = Field(default_factory=dict, description=(
        "The LLM servers to run, by name."))

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
