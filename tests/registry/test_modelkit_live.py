"""A target and its draft from one ModelKit in a real registry on loopback (Debian's
docker-registry, tests/oci_registry.py), served by the real llama-server with speculation
(docs/modelkits.md): `check` resolves it without a download, the daemon pulls it before the
first start and records the digests; a tag moved and reloaded restarts the target on the
new digest; a registry that is down at the next daemon start serves from the cache; a
tampered layer fails the start with both digests; a registry down with nothing cached is
retried, saying so."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, llama_target, post_json, wait_for, write_fleet
from tests.supervision.test_handover_live import proxy_of


def modelkit_target(ref: str, binary: str) -> dict:
    target = llama_target("", binary, modelkit=ref, speculation={
        "method": "draft", "length": {"start": 4}})
    del target["model"]
    return target


def check(fleet: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)


def run_record(daemon, name: str) -> dict:
    return json.loads((daemon.state_dir / "runs" / f"{name}.json").read_text())


def test_a_target_and_its_draft_from_one_modelkit_serve_with_speculation_and_keep_provenance(
        tmp_path, model, llama_server_bin, start_daemon, oci_registry):
    weights = Path(model).read_bytes()
    pushed = oci_registry.push_modelkit(
        "lab/gemma", "v1", ("models/gemma.gguf", weights),
        [("draft", "models/draft.gguf", weights)], {"name": "gemma-pair", "version": "1.0"})
    ref = f"{oci_registry.host}/lab/gemma:v1"
    fleet = write_fleet(tmp_path, {"t": modelkit_target(ref, llama_server_bin)})
    checked = check(fleet)
    assert checked.returncode == 0, checked.stderr
    assert f"modelkit {ref} -> {pushed}" in checked.stdout and "gemma-pair 1.0" in checked.stdout
    assert "to pull" in checked.stdout and "--spec-draft-model" in checked.stdout
    assert not (tmp_path / "state" / "modelkits" / "layers").exists()  # manifests only

    daemon = start_daemon(fleet)
    ready = daemon.wait_state("t", "ready", timeout=300)
    kit = ready["modelkit"]
    assert kit["manifest_digest"] == pushed and kit["package"] == {"name": "gemma-pair",
                                                                    "version": "1.0"}
    assert set(kit["layers"]) == {"model", "draft"} and "pull" not in kit
    cache = tmp_path / "state" / "modelkits"
    assert ready["model"].startswith(str(cache))
    answer = post_json(f"{proxy_of(fleet)}/v1/completions", {
        "model": "t", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})
    assert answer["choices"][0]["text"]
    wait_for(lambda: (daemon.target("t").get("metrics") or {}).get("draft_tokens"), 60,
             "drafted tokens in the counters")
    record = wait_for(lambda: (r := run_record(daemon, "t"))["files"]["model"]["sha256"]
                      and r, 120, "the model's sha256 in the run record")
    assert record["modelkit"]["manifest_digest"] == pushed
    assert record["modelkit"]["reference"] == ref
    assert record["files"]["model"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert record["files"]["draft"]["path"].startswith(str(cache))
    shown = subprocess.run([sys.executable, "-m", "supervisor", "status", str(fleet),
                            "--target", "t"], capture_output=True, text=True, cwd=REPO,
                           timeout=60, check=False).stdout
    assert f"from         {ref} = {pushed} (gemma-pair 1.0)" in shown, shown
    assert f"modelkit     {ref} @ {pushed[:19]}" in shown, shown
    pulled = [e for e in daemon.events("t") if e["kind"] == "modelkit"]
    assert pulled and "serving model" in pulled[-1]["reason"]

    # The tag moves (a new package version, the same layers) and the file is reloaded.
    moved = oci_registry.push_modelkit(
        "lab/gemma", "v1", ("models/gemma.gguf", weights),
        [("draft", "models/draft.gguf", weights)], {"name": "gemma-pair", "version": "1.1"})
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: (daemon.target("t").get("modelkit") or {}).get("manifest_digest") == moved
             and daemon.target("t").get("state") == "ready", 240, "the target on the new digest")
    said = [e["reason"] for e in daemon.events("t") if e["kind"] == "modelkit"]
    assert any(f"moved: {pushed} -> {moved}" in r for r in said), said
    assert run_record(daemon, "t")["modelkit"]["package"]["version"] == "1.1"
    assert daemon.stop() == 0

    # The registry is down at the next daemon start: the cached digest starts.
    oci_registry.stop()
    again = start_daemon(fleet)
    back = again.wait_state("t", "ready", timeout=180)
    assert back["modelkit"]["manifest_digest"] == moved
    assert "cannot be reached" in back["modelkit"]["offline"]


def test_a_tampered_layer_fails_the_start_with_both_digests(
        tmp_path, llama_server_bin, start_daemon, oci_registry):
    weights = b"GGUF" + bytes(4096)
    oci_registry.push_modelkit("lab/t", "v1", ("m.gguf", weights),
                               [("draft", "d.gguf", weights + b"d")], {"name": "t"})
    manifest = json.loads(oci_registry.get_manifest("lab/t", "v1"))
    model_layer = manifest["layers"][0]["digest"]
    blob = oci_registry.blob_file(model_layer)
    blob.write_bytes(blob.read_bytes().replace(bytes(64), b"x" * 64, 1))
    fleet = write_fleet(tmp_path, {"t": modelkit_target(f"{oci_registry.host}/lab/t:v1",
                                                         llama_server_bin)})
    daemon = start_daemon(fleet)
    failed = daemon.wait_state("t", "failed", timeout=60)
    reason = failed["last_event"]["reason"]
    assert model_layer in reason and "is not what the manifest names" in reason
    assert not list((tmp_path / "state" / "modelkits" / "layers").glob("*"))


def test_a_registry_down_with_nothing_cached_is_retried_and_says_so(
        tmp_path, llama_server_bin, start_daemon, oci_registry):
    ref = f"{oci_registry.host}/lab/none:v1"
    oci_registry.stop()
    fleet = write_fleet(tmp_path, {"t": modelkit_target(ref, llama_server_bin)})
    checked = check(fleet)
    assert checked.returncode == 2 and "never pulled here" in checked.stderr
    daemon = start_daemon(fleet)
    waiting = daemon.wait_state("t", "waiting", timeout=60)  # what the host lacks (issue 48)
    assert "cannot be reached" in waiting["last_event"]["reason"]
    assert "never pulled here" in waiting["last_event"]["reason"]
    assert "tries to start again" in waiting["last_event"]["reason"]


def test_a_signed_kit_serves_under_required_and_a_tag_moved_unsigned_is_refused_on_reload(
        tmp_path, model, llama_server_bin, start_daemon, oci_registry):
    """The whole daemon, the real model in a kit signed in cosign's layout with a key this
    test makes: `check` and the start verify it and say who signed; the tag moved to a kit
    nobody signed and the file reloaded: refused, the same server goes on answering;
    `check` then refuses the fleet naming the reference, the digest and the keys tried."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from tests.oci_registry import cosign_sign, public_pem

    weights = Path(model).read_bytes()
    ops = ec.generate_private_key(ec.SECP256R1())
    signed = oci_registry.push_modelkit("lab/gemma", "v1", ("models/gemma.gguf", weights),
                                        [], {"name": "gemma", "version": "1.0"})
    cosign_sign(oci_registry, "lab/gemma", signed, ops)
    ref = f"{oci_registry.host}/lab/gemma:v1"
    target = llama_target("", llama_server_bin, modelkit={"ref": ref, "verify": "required"})
    del target["model"]
    fleet = write_fleet(tmp_path, {"t": target}, modelkits={
        "keys": {"ops": public_pem(ops, tmp_path / "ops.pub")}})
    checked = check(fleet)
    assert checked.returncode == 0, checked.stderr

    daemon = start_daemon(fleet)
    ready = daemon.wait_state("t", "ready", timeout=300)
    assert ready["modelkit"]["signature"] == "verified"
    assert ready["modelkit"]["signed_by"] == "ops"
    record = wait_for(lambda: run_record(daemon, "t").get("modelkit"), 60, "the run record")
    assert record["signed_by"] == "ops" and record["manifest_digest"] == signed
    serving = ready["pid"]

    unsigned = oci_registry.push_modelkit("lab/gemma", "v1", ("models/gemma.gguf", weights),
                                          [], {"name": "gemma", "version": "1.1"})
    daemon.signal(signal.SIGHUP)
    refused = wait_for(lambda: next((e for e in daemon.events("t") if e["kind"] == "replace"
                                     and (e.get("data") or {}).get("replace") == "refused"),
                                    None), 120, "the reload refused")
    assert "is not trusted" in refused["reason"] and unsigned in refused["reason"], refused
    now = daemon.target("t")
    assert now["pid"] == serving and now["state"] == "ready"
    assert now["modelkit"]["manifest_digest"] == signed
    answer = post_json(f"{proxy_of(fleet)}/v1/completions", {
        "model": "t", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert answer["choices"][0]["text"]

    again = check(fleet)
    assert again.returncode == 2, again.stdout
    for part in (ref, unsigned, "no signature", "keys tried: ops"):
        assert part in again.stderr, again.stderr
    assert daemon.stop() == 0
