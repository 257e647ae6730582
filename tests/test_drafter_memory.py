"""Which llama.cpp n-gram drafters learn across requests (Backend.drafter_learns), measured
on the real llama-server: the same request sent twice to a fresh server. ngram-mod keeps
one hash pool for every request until the server stops, so the second copy drafts from the
first one's output; ngram-simple looks only at the request's own context, so both copies
draft alike. The tuner relies on it: a restarted ngram-mod is not judged until warm."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from plugins.llamacpp.backend import LlamaCppBackend, method_args
from supervisor.config.schema import Target
from tests.conftest import free_port, post_json, wait_for

# Output that is not in the prompt: the first copy has little to draft from.
PROMPT = ("Write the numbers from one to forty in English words, separated by commas, "
          "then the names of the planets of the solar system:\n")


def healthy(port: int, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, "llama-server exited"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def twice(binary: str, model: str, target: Target) -> list[dict[str, Any]]:
    """The same completion twice on one fresh server: each one's draft counters."""
    port = free_port()
    cmd = [binary, "-m", model, "--port", str(port), "--ctx-size", "2048", "--parallel", "1",
           "--threads", "2", *method_args(target, 16)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: healthy(port, proc), 120, "llama-server's /health")
        return [post_json(f"http://127.0.0.1:{port}/completion",
                          {"prompt": PROMPT, "n_predict": 96, "temperature": 0,
                           "cache_prompt": False}, timeout=300)["timings"]
                for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait(30)


def ngram(variant: str, model: str) -> Target:
    return Target(name="t", model=model, port=1,
                  speculation={"method": "ngram", "variant": variant})


@pytest.mark.parametrize(("method", "variant", "learns"), [
    ("ngram", "mod", True), ("ngram", None, True),  # mod is llama.cpp's default variant
    ("ngram", "simple", False), ("ngram", "map-k", False), ("draft", None, False),
])
def test_only_ngram_mod_is_declared_to_learn(method, variant, learns, tmp_path):
    spec: dict[str, Any] = {"method": method, "variant": variant} if method == "ngram" \
        else {"method": "draft", "draft": str(tmp_path / "d.gguf")}
    target = Target(name="t", model=str(tmp_path / "m.gguf"), port=1, speculation=spec)
    assert LlamaCppBackend(target).drafter_learns() is learns


def test_ngram_mod_drafts_from_earlier_requests_and_ngram_simple_does_not(
        llama_server_bin, model):
    # llama-server leaves draft_n and draft_n_accepted out of `timings` when nothing was
    # drafted. Measured (b11434, n-max 16): mod 0 then 41 accepted of 48; simple 0 and 0.
    mod = [accepted(t) for t in twice(llama_server_bin, model, ngram("mod", model))]
    simple = [accepted(t) for t in twice(llama_server_bin, model, ngram("simple", model))]
    # The same request on a server that has seen it: mod accepts far more.
    assert mod[1] >= mod[0] + 20, mod
    # simple: the second copy drafts what the first did (temperature 0, same context).
    assert simple[1] <= simple[0] + 5, simple


def accepted(timings: dict[str, Any]) -> int:
    return int(timings.get("draft_n_accepted", 0))
