"""Which llama.cpp n-gram drafters learn across requests (Backend.drafter_learns), measured
on the real llama-server: the same request sent twice to a fresh server. ngram-mod keeps
one hash pool for every request until the server stops, so the second copy drafts from the
first one's output; ngram-simple looks only at the request's own context, so both copies
draft alike. The tuner relies on it: a restarted ngram-mod is not judged until warm.

The answer is forced by a grammar, so both copies generate the same text whatever the
model and the CPU. Without it the test depended on the model repeating itself: at
temperature 0 the second copy is verified in batches (the drafts), whose arithmetic
differs from one-token steps, and on an AMD EPYC the second copy turned from "Mercury" to
"Jupiter" at its second token, so the pool's drafts were rejected (accepted 0 then 1; on
the Xeon it was written on, 0 then 41)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from plugins.llamacpp.flags import method_args
from supervisor.config.schema import Target
from tests.conftest import free_port, post_json, wait_for

PROMPT = "Tell me a short story about a lighthouse keeper.\n"
# Not in the prompt and without a repeated run of words: the first copy has nothing to
# draft from (ngram-mod matches 24 tokens, ngram-simple 12), the second has the first.
ANSWER = ("The lighthouse keeper on Varnholm Island kept a ledger of every ship that passed: "
          "the Mirelle in March, the Osterbay in April, the Calloway twice in June, and in the "
          "autumn a grey schooner with no name that never came back.")
# GBNF: the one string; a JSON string literal is a valid GBNF literal.
GRAMMAR = f"root ::= {json.dumps(ANSWER)}"


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
        answers = [post_json(f"http://127.0.0.1:{port}/completion",
                             {"prompt": PROMPT, "n_predict": 200, "temperature": 0,
                              "grammar": GRAMMAR, "cache_prompt": False}, timeout=300)
                   for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait(30)
    assert [a["content"] for a in answers] == [ANSWER, ANSWER]
    return [a["timings"] for a in answers]


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
    # drafted. Measured (b11434, n-max 16, AMD EPYC): mod drafted 0, then 94 of which 78
    # were accepted; simple 0 and 0. (The copies may split a word into other tokens: the
    # grammar fixes the text, the model picks the pieces; 122 and 124 tokens here.)
    mod = twice(llama_server_bin, model, ngram("mod", model))
    simple = twice(llama_server_bin, model, ngram("simple", model))
    # Nothing to draft from in the first copy, for either drafter.
    assert drafted(mod[0]) == drafted(simple[0]) == 0, (mod, simple)
    # The second copy on a server that has seen the first: mod drafts from its pool (a
    # draft needs n-min = 12 tokens found in a row) and the forced text takes some of it.
    assert drafted(mod[1]) >= 12 and accepted(mod[1]) > 0, mod
    # simple remembers nothing: the second copy has nothing to draft from either.
    assert drafted(simple[1]) == 0, simple


def drafted(timings: dict[str, Any]) -> int:
    return int(timings.get("draft_n", 0))


def accepted(timings: dict[str, Any]) -> int:
    return int(timings.get("draft_n_accepted", 0))
