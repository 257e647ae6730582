"""The draft-model pair `specfleet setup --pair` makes from the packaged model
(supervisor/models/derive.py): the files are what they claim, the pairing guard accepts
them, the memory estimate knows them, and on the real llama-server the two drafts agree
with the target to different degrees (docs/tuning.md, "A real draft-model pair")."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target
from supervisor.models import facts
from supervisor.models.derive import without_blocks
from supervisor.plugin import pairing_findings
from tests.conftest import free_port, wait_for


def pair_target(model_pair: dict[str, str], draft: str, port: int = 1) -> Target:
    return Target(name="p", model=model_pair["target"], port=port,
                  speculation={"method": "draft", "draft": model_pair[draft],
                               "length": {"start": 4}})


def test_the_partial_draft_is_the_model_without_two_blocks(model_pair, gemma_model):
    source, partial = facts.read(gemma_model), facts.read(model_pair["partial_draft"])
    assert partial.block_count == source.block_count - 2
    assert partial.architecture == source.architecture
    assert facts.read(model_pair["target"]).block_count == source.block_count


def test_dropping_blocks_outside_the_model_is_refused(gemma_model, tmp_path: Path):
    with pytest.raises(ValueError, match=r"within 0\.\."):
        without_blocks(Path(gemma_model), tmp_path / "x.gguf", [99])
    assert not list(tmp_path.iterdir())  # nothing half-written left


@pytest.mark.parametrize("draft", ["close_draft", "partial_draft"])
def test_the_pairing_guard_accepts_both_drafts_and_the_estimate_counts_them(model_pair, draft):
    backend = LlamaCppBackend(pair_target(model_pair, draft))
    assert [f for f in pairing_findings(backend) if f.level == "error"] == []
    estimate = backend.memory_estimate(on_gpu=False)
    assert estimate is not None
    # The F32 target alone is about 1 GB; the estimate holds it and the draft's weights.
    assert estimate.weights > Path(model_pair["target"]).stat().st_size
    assert any("draft" in what for what, _ in estimate.parts)


def test_the_two_drafts_agree_with_the_target_to_different_degrees(model_pair,
                                                                  llama_server_bin):
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    accepted = {}
    for draft in ("close_draft", "partial_draft"):
        port = free_port()
        argv = [llama_server_bin, "-m", model_pair["target"], "--spec-type", "draft-simple",
                "--spec-draft-model", model_pair[draft], "--spec-draft-n-max", "4",
                "--port", str(port), "--ctx-size", "1024", "--parallel", "1",
                "--threads", "2"]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda p=port: _healthy(p), 120, f"llama-server with {draft}")
            body = json.dumps({"prompt": prompt, "n_predict": 64, "temperature": 0}).encode()
            with urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{port}/completion", body), timeout=300) as resp:
                timings = json.loads(resp.read())["timings"]
        finally:
            server.kill()
            server.wait()
        assert timings["draft_n"] > 0
        accepted[draft] = timings["draft_n_accepted"] / timings["draft_n"]
    # The Q4_K_M is the target's own weights, quantized: it agrees far more often than the
    # copy without two blocks, which agrees only part of the time.
    assert 0 < accepted["partial_draft"] < 0.9
    assert accepted["close_draft"] > accepted["partial_draft"]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
