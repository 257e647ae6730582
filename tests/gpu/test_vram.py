"""VRAM planner: plain-number unit tests, and the estimate against llama-server's own log."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from plugins.llamacpp.flags import context_settings
from supervisor.cli.main import main
from supervisor.config.schema import Target
from supervisor.gpu import nvml as gpus
from supervisor.gpu import vram
from supervisor.gpu.vram import ContextSettings, Demand, Device, Estimate, GiB, MiB
from supervisor.models import facts as modelfacts
from tests.conftest import free_port, llama_target, wait_for, write_fleet


def demand(name, gib, gpus=None, fills=False):
    return Demand(name, Estimate(weights=int(gib * GiB)), gpus, fills)


def test_targets_that_fit_are_placed_and_the_one_that_does_not_is_refused_with_numbers():
    devices = [Device(0, "RTX 4090", 24 * GiB, 24 * GiB)]
    result = vram.plan([demand("a", 10, (0,)), demand("b", 12, (0,)), demand("c", 4, (0,))],
                       devices, 1 * GiB)
    assert set(result.assignments) == {"a", "b"}
    assert result.refused["c"] == ("needs 4.00 GiB (weights 4.00 GiB) but GPU 0 (RTX 4090) "
                                   "1.00 GiB free after 1.00 GiB headroom; already planned "
                                   "there: a 10.00 GiB, b 12.00 GiB")


def test_unplaced_targets_go_largest_first_to_the_gpu_with_most_room():
    devices = [Device(0, "A", 24 * GiB, 20 * GiB), Device(1, "B", 24 * GiB, 24 * GiB)]
    result = vram.plan([demand("small", 6), demand("large", 18), demand("mid", 12)], devices, 0)
    assert result.assignments["large"].gpus == (1,)  # most room first
    assert result.assignments["mid"].gpus == (0,)  # 20 free against 6 left on GPU 1
    assert result.assignments["small"].gpus == (0,)  # 8 free on 0, 6 on 1: 0 has more
    assert result.refused == {}


def test_a_target_on_two_gpus_is_split_in_proportion_to_their_room():
    devices = [Device(0, "A", 24 * GiB, 12 * GiB), Device(1, "B", 24 * GiB, 24 * GiB)]
    result = vram.plan([demand("big", 30, (0, 1))], devices, 0)
    per_gpu = result.assignments["big"].per_gpu
    assert per_gpu[0] == 10 * GiB and per_gpu[1] == 20 * GiB


def test_an_unknown_gpu_index_is_refused():
    result = vram.plan([demand("x", 1, (3,))], [Device(0, "A", 24 * GiB, 24 * GiB)], 0)
    assert result.refused["x"] == "gpus [3] names GPU 3, but the GPUs are [0]"


def test_two_vllm_style_targets_on_one_gpu_get_an_explicit_split():
    devices = [Device(0, "H100", 80 * GiB, 80 * GiB)]
    result = vram.plan([demand("a", 20, (0,), fills=True), demand("b", 40, (0,), fills=True)],
                       devices, 2 * GiB)
    fa, fb = result.assignments["a"].memory_fraction, result.assignments["b"].memory_fraction
    # 18 GiB spare after needs and headroom, shared 1:2 on top of 20 and 40 GiB.
    assert fa == pytest.approx(26 / 80, abs=0.001) and fb == pytest.approx(52 / 80, abs=0.001)
    assert round(1000 * (fa + fb)) <= 1000 * (80 - 2) // 80  # never more than there is


def test_context_settings_follow_llama_server_flags():
    assert context_settings([]) == ContextSettings(parallel=4, unified=True)
    s = context_settings(["-c", "8192", "--parallel=2", "-ctk", "q8_0", "-ngl", "10"])
    assert (s.ctx, s.parallel, s.unified, s.cache_type_k, s.gpu_layers) == (
        8192, 2, False, "q8_0", 10)
    assert context_settings(["-np", "2", "-kvu"]).unified


def test_kv_cache_of_sliding_window_layers_is_smaller():
    facts = modelfacts.ModelFacts(
        path="m", format="gguf", architecture="gemma3", parameters=0, weight_bytes=0,
        block_bits_per_weight=None, file_type=None, embedding_length=640, block_count=18,
        head_count=4, head_count_kv=1, key_length=256, value_length=256, context_length=32768,
        feed_forward_length=2048, sliding_window=512, swa_layers=15, n_vocab=262144,
        tokenizer=None)
    assert vram.kv_cells(facts, ContextSettings()) == (1, 32768, 2560)
    assert vram.kv_cells(facts, ContextSettings(ctx=8192, parallel=2, unified=False)) == (
        2, 4096, 1024)
    assert vram.kv_cells(facts, ContextSettings(swa_full=True)) == (1, 32768, 32768)
    # 3 full layers x 32768 cells + 15 sliding layers x 2560 cells, 1 KiB per cell (f16 K+V)
    assert vram.llamacpp_model(facts, ContextSettings()).kv == (3 * 32768 + 15 * 2560) * 1024


_BUFFER = re.compile(r"(\S+) +(model|KV|compute|output) buffer size = +([\d.]+) MiB")


def llama_server_buffers(binary: str, model: str, args: list[str], log: Path) -> dict[str, float]:
    """MiB per buffer kind, as llama-server logs them when it loads for real (after --fit's
    dry run), for a CPU-only run."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "-m", model, "--port", str(port), "-v", *args],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_for(healthy, 90, "llama-server to load")
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text(errors="replace")
    real = text[text.rindex("fitting params to free memory took"):]  # skip the dry run
    sizes: dict[str, float] = {}
    for buffer, kind, mib in _BUFFER.findall(real):
        sizes[kind] = sizes.get(kind, 0.0) + float(mib)
        if buffer == "CPU_REPACK":
            sizes["repack"] = sizes.get("repack", 0.0) + float(mib)
    return sizes


@pytest.mark.parametrize("args", [[], ["-c", "8192", "-np", "2"]], ids=["defaults", "ctx8k-np2"])
def test_the_estimate_for_gemma_is_within_15_percent_of_what_llama_server_allocates(
        tmp_path, gemma_model, llama_server_bin, args):
    logged = llama_server_buffers(llama_server_bin, gemma_model, ["--threads", "1", *args],
                                  tmp_path / "server.log")
    target = Target(name="g", model=gemma_model, port=1, args=tuple(args))
    est = LlamaCppBackend(target).memory_estimate(on_gpu=False)
    assert est is not None
    weights_logged = logged["model"] - logged.get("repack", 0.0)  # repack: CPU-only copies
    total_logged = sum(v for k, v in logged.items() if k != "repack")
    print(f"\n{args}: logged {logged}; estimate weights {est.weights / MiB:.2f} kv "
          f"{est.kv / MiB:.2f} compute {est.compute / MiB:.2f} output {est.output / MiB:.2f} "
          f"total {est.total / MiB:.2f} MiB (logged total {total_logged:.2f})")
    assert est.weights / MiB == pytest.approx(weights_logged, rel=0.15)
    assert est.kv / MiB == pytest.approx(logged["KV"], rel=0.15)
    assert est.total / MiB == pytest.approx(total_logged, rel=0.15)


def test_without_a_gpu_or_declared_memory_check_says_it_cannot_plan(tmp_path, model, capsys):
    if gpus.read().gpus:
        pytest.skip("this machine has an NVIDIA GPU")
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, "/bin/true")})
    assert main(["check", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert "cannot plan VRAM: no NVIDIA GPU: NVML is unavailable" in out
    assert re.search(r"chat +CPU +235 MiB", out)


def test_a_target_that_cannot_fit_the_declared_memory_is_refused_by_check_and_by_the_daemon(
        tmp_path, model, start_daemon, capsys):
    target = llama_target(model, "/bin/true", gpus=[0])
    fleet = write_fleet(tmp_path, {"big": target}, gpu={"memory": ["300MiB"], "headroom": "0"})
    assert main(["check", str(fleet)]) == 2
    captured = capsys.readouterr()
    assert "VRAM plan against declared memory (daemon.gpu.memory)" in captured.out
    assert "targets.big: does not fit in GPU memory: needs" in captured.err
    assert "GPU 0 (declared) 300 MiB free after 0 MiB headroom" in captured.err

    daemon = start_daemon(fleet)
    failed = daemon.wait_state("big", "failed", 30)
    assert "target 'big' does not fit in GPU memory: needs" in failed["last_event"]["reason"]
    assert ("starting", "failed") in daemon.transitions("big")
    assert failed["pid"] is None and not list((tmp_path / "state" / "runs").glob("big.json"))


def test_declared_memory_that_fits_places_the_target_and_sets_its_gpus(tmp_path, model, capsys):
    fleet = write_fleet(tmp_path, {"small": llama_target(model, "/bin/true")},
                        gpu={"memory": ["24GiB", "24GiB"]})
    assert main(["check", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES=0" in out and re.search(r"small +GPU .* GPU 0\n", out + "\n")
