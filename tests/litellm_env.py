"""LiteLLM's proxy for the command backend's live tests (tests/backends/test_command_live.py):
a real OpenAI-compatible server that is no built-in backend, from PyPI, in a venv of its own
in the cache (its ~120 dependencies must not meet specfleet's environment). scripts/setup.sh
runs this module; the `litellm_bin` fixture installs on first use where it did not.

    .venv/bin/python -m tests.litellm_env
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# The version RUNTIMES.md names as tried here; pinned so that a new release cannot change
# what the tests run against without a commit.
REQUIREMENT = "litellm[proxy]==1.108.7"


def venv_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "specfleet" / "litellm"


def litellm_server(progress: Callable[[str], None] = print) -> Path:
    """The `litellm` console script, installed first where it is not."""
    venv = venv_dir()
    script = venv / "bin" / "litellm"
    marker = venv / ".installed"
    if script.exists() and marker.exists() and marker.read_text() == REQUIREMENT:
        return script
    progress(f"installing {REQUIREMENT} into {venv} (about 2 minutes)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    REQUIREMENT], check=True)
    marker.write_text(REQUIREMENT)
    return script


if __name__ == "__main__":
    print(f"litellm: {litellm_server()}")
