"""VRAM estimates and the placement plan. Pure: numbers in, numbers and reasons out.

The estimate for a llama.cpp target follows what llama-server allocates (b11434,
measured against its own buffer log lines, see tests/gpu/test_vram.py):

- weights: the tensor bytes of the GGUF (all layers offloaded; `-ngl N` scales them);
- KV cache: per layer and cell, head_count_kv x (key_length + value_length) x bytes of the
  cache type. Full-attention layers keep `n_ctx` cells, sliding-window layers
  `n_swa x n_seq + n_ubatch` (unified cache, llama-server's default when `--parallel` is
  auto) or `n_swa + n_ubatch` per sequence; `--swa-full` keeps the full context everywhere;
- output: n_seq x n_vocab float logits;
- compute: the graph reservation for one ubatch: the f16 attention masks over the cached
  cells plus the widest per-token activations (a heuristic that matched llama.cpp's own
  reservation within 6 % for gemma-3 on the CPU);
- on a GPU, a fixed allowance for the CUDA context and cuBLAS workspace of each process.

A draft model is a second model in the same process with the same context settings;
an EAGLE-3 or MTP head likewise, with its own (few) layers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from supervisor.models.facts import ModelFacts

MiB = 1 << 20
GiB = 1 << 30
# CUDA context + cuBLAS workspace per process, not in llama.cpp's buffer logs
# (typically 300-600 MiB on current drivers).
GPU_RUNTIME_OVERHEAD = 512 * MiB
# Bytes per cached element by KV cache type (ggml block sizes: 32 values per block).
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                    "q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
KV_PAD = 256  # llama.cpp pads the cell count of a KV cache to a multiple of 256


@dataclass(frozen=True)
class ContextSettings:
    """The runtime settings that size the KV cache and the compute buffers."""

    ctx: int | None = None  # None or 0: the model's training context
    parallel: int = 4  # sequences (server slots)
    unified: bool = True  # one KV pool shared by all sequences
    ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = False
    gpu_layers: int | None = None  # None: all layers on the GPU


@dataclass(frozen=True)
class Estimate:
    """Bytes one target needs, by part."""

    weights: int = 0
    kv: int = 0
    output: int = 0
    compute: int = 0
    overhead: int = 0
    parts: tuple[tuple[str, int], ...] = ()  # (what, bytes) for the table, e.g. draft weights

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.output + self.compute + self.overhead

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.weights + other.weights, self.kv + other.kv,
                        self.output + other.output, self.compute + other.compute,
                        self.overhead + other.overhead, self.parts + other.parts)

    def describe(self) -> str:
        items = [("weights", self.weights), ("KV cache", self.kv), ("output", self.output),
                 ("compute", self.compute), ("CUDA runtime", self.overhead)]
        return ", ".join(f"{what} {gib(n)}" for what, n in items if n)


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / MiB:.0f} MiB"


def _pad(n: int) -> int:
    return -(-n // KV_PAD) * KV_PAD


def kv_cells(facts: ModelFacts, s: ContextSettings) -> tuple[int, int, int]:
    """(streams, full-attention cells per stream, sliding-window cells per stream)."""
    n_ctx = s.ctx or facts.context_length or 4096
    streams = 1 if s.unified else max(1, s.parallel)
    full = n_ctx if s.unified else max(1, n_ctx // streams)
    if not facts.swa_layers or s.swa_full or not facts.sliding_window:
        return streams, full, full
    per_stream_seqs = s.parallel if s.unified else 1
    swa = min(full, _pad(facts.sliding_window * per_stream_seqs + s.ubatch))
    return streams, full, swa


def llamacpp_model(facts: ModelFacts, s: ContextSettings, label: str = "model") -> Estimate:
    """One model (target, draft or head) inside llama-server."""
    layers = facts.block_count or 0
    bytes_k = CACHE_TYPE_BYTES.get(s.cache_type_k, 2.0)
    bytes_v = CACHE_TYPE_BYTES.get(s.cache_type_v, 2.0)
    per_cell = (facts.head_count_kv or 0) * ((facts.key_length or 0) * bytes_k
                                            + (facts.value_length or 0) * bytes_v)
    streams, full, swa = kv_cells(facts, s)
    full_layers = layers - facts.swa_layers
    kv = int(streams * per_cell * (full_layers * full + facts.swa_layers * swa))
    weights = facts.weight_bytes
    if s.gpu_layers is not None and layers:
        weights = int(weights * min(1.0, max(0, s.gpu_layers) / layers))
    output = s.parallel * (facts.n_vocab or 0) * 4
    masks = 2 * (full + (swa if facts.swa_layers else 0))
    activations = 4 * (3 * (facts.feed_forward_length or 0) + 4 * (facts.embedding_length or 0))
    compute = s.ubatch * (masks + activations)
    return Estimate(weights, kv, output, compute, 0,
                    ((f"{label} weights", weights), (f"{label} KV cache", kv)))


# --- the plan ---

@dataclass(frozen=True)
class Device:
    index: int
    name: str
    total: int
    free: int


@dataclass(frozen=True)
class Demand:
    target: str
    estimate: Estimate
    gpus: tuple[int, ...] | str | None  # as in the fleet file; None = let the planner choose
    fills_memory: bool = False  # vLLM-style: takes a fraction of the GPU, not what it needs
    swaps: bool = False  # loaded on demand and unloaded (docs/on-demand.md)

    @property
    def need(self) -> int:
        return self.estimate.total


@dataclass(frozen=True)
class Assignment:
    target: str
    gpus: tuple[int, ...]
    per_gpu: dict[int, int]
    memory_fraction: float | None = None  # for runtimes that take a fraction of the GPU


@dataclass
class Plan:
    devices: list[Device]
    headroom: int
    assignments: dict[str, Assignment] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # target -> why, with the numbers
    planned: dict[int, int] = field(default_factory=dict)  # gpu -> bytes assigned
    # When the targets that swap do not all fit at once: the room they share on each GPU
    # (after the targets that always run), the most of them that fit together, and the
    # others (loaded on demand by unloading some).
    room: dict[int, int] | None = None
    at_once: tuple[str, ...] = ()
    swapped: tuple[str, ...] = ()

    def available(self, gpu: int) -> int:
        device = next(d for d in self.devices if d.index == gpu)
        return device.free - self.headroom - self.planned.get(gpu, 0)


def plan(demands: list[Demand], devices: list[Device], headroom: int) -> Plan:
    """Place each demand on GPUs: explicit `gpus` first, in file order, then the rest,
    largest first, each on the GPU with the most room. A demand that does not fit is
    refused with the numbers; nothing is overcommitted."""
    result = Plan(devices, headroom)
    known = {d.index for d in devices}
    explicit = [d for d in demands if isinstance(d.gpus, tuple) or d.gpus == "all"]
    chosen = sorted((d for d in demands if d.gpus is None), key=lambda d: -d.need)
    for demand in explicit:
        gpus = tuple(sorted(known)) if demand.gpus == "all" else tuple(demand.gpus)  # type: ignore[arg-type]
        missing = [g for g in gpus if g not in known]
        if missing:
            result.refused[demand.target] = (
                f"gpus {list(gpus)} names GPU {missing[0]}, but the GPUs are "
                f"{sorted(known) if known else 'none'}")
            continue
        _place(result, demand, gpus)
    for demand in chosen:
        if not devices:
            result.refused[demand.target] = "no GPU to place it on"
            continue
        best = max(devices, key=lambda d: (result.available(d.index), -d.index))
        _place(result, demand, (best.index,))
    _split_fill_targets(result, demands)
    return result


def plan_fleet(demands: list[Demand], devices: list[Device], headroom: int) -> Plan:
    """`plan`, for a fleet where some targets swap: if everything fits at once, that plan.
    Otherwise the targets that always run are planned together (and refused as by `plan`),
    and each target that swaps is placed alone in the room they leave: it must fit there by
    itself, and is loaded beside the others as far as the room goes (gpu/swap.py)."""
    whole = plan(demands, devices, headroom)
    swapping = [d for d in demands if d.swaps]
    if not whole.refused or not swapping or not devices:
        return whole
    result = plan([d for d in demands if not d.swaps], devices, headroom)
    left = [Device(d.index, d.name, d.total, d.free - result.planned.get(d.index, 0))
            for d in devices]
    result.room = {d.index: d.free - headroom for d in left}
    for demand in swapping:
        alone = plan([demand], left, headroom)
        result.refused.update({t: f"{why}, even with no other on-demand target loaded"
                               for t, why in alone.refused.items()})
        result.assignments.update(alone.assignments)
    placed = [d for d in swapping if d.target not in result.refused]
    result.at_once = _largest_together(placed, left, headroom)
    result.swapped = tuple(d.target for d in placed if d.target not in result.at_once)
    return result


def _largest_together(demands: list[Demand], devices: list[Device],
                      headroom: int) -> tuple[str, ...]:
    """The most targets that fit at once (the worst case for memory): every subset, largest
    first, for up to 12 targets; past that, greedily in file order."""
    if len(demands) > 12:
        fits: list[Demand] = []
        for d in demands:
            if not plan([*fits, d], devices, headroom).refused:
                fits.append(d)
        return tuple(d.target for d in fits)
    for size in range(len(demands), 0, -1):
        for subset in itertools.combinations(demands, size):
            if not plan(list(subset), devices, headroom).refused:
                return tuple(d.target for d in subset)
    return ()


def _place(result: Plan, demand: Demand, gpus: tuple[int, ...]) -> None:
    # llama.cpp splits layers across GPUs in proportion to their free memory.
    room = {g: max(0, result.available(g)) for g in gpus}
    total_room = sum(room.values())
    per_gpu = {g: (demand.need * room[g] // total_room if total_room else demand.need)
               for g in gpus}
    short = [g for g in gpus if per_gpu[g] > result.available(g)] if total_room else list(gpus)
    if short or demand.need > total_room:
        where = " + ".join(f"GPU {g} ({_device(result, g).name}) {gib(max(0, result.available(g)))}"
                           for g in gpus)
        others = {t: a for t, a in result.assignments.items() if set(a.gpus) & set(gpus)}
        planned = ("; already planned there: " + ", ".join(
            f"{t} {gib(sum(a.per_gpu.get(g, 0) for g in gpus))}" for t, a in others.items())
            if others else "")
        result.refused[demand.target] = (
            f"needs {gib(demand.need)} ({demand.estimate.describe()}) but {where} free after "
            f"{gib(result.headroom)} headroom{planned}")
        return
    for g, n in per_gpu.items():
        result.planned[g] = result.planned.get(g, 0) + n
    result.assignments[demand.target] = Assignment(demand.target, gpus, per_gpu)


def _device(result: Plan, gpu: int) -> Device:
    return next(d for d in result.devices if d.index == gpu)


def _split_fill_targets(result: Plan, demands: list[Demand]) -> None:
    """Runtimes that claim a fraction of the GPU (vLLM's --gpu-memory-utilization, default
    0.92 of the total per instance) must be told their share explicitly: each gets what it
    needs plus a share of the room left, in proportion to its need."""
    fill = {d.target for d in demands if d.fills_memory and d.target in result.assignments}
    for device in result.devices:
        here = [t for t in fill if device.index in result.assignments[t].gpus]
        if not here:
            continue
        spare = max(0, result.available(device.index))
        needs = {t: result.assignments[t].per_gpu[device.index] for t in here}
        for t in here:
            share = needs[t] + spare * needs[t] // max(1, sum(needs.values()))
            fraction = int(1000 * share / device.total) / 1000  # round down: never over
            old = result.assignments[t]
            frac = fraction if old.memory_fraction is None else min(old.memory_fraction, fraction)
            result.assignments[t] = Assignment(t, old.gpus, old.per_gpu, frac)
