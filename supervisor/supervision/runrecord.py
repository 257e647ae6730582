"""Run records: what actually ran, per launch, in <state_dir>/runs/.

`<target>.json` is the latest launch, `<target>.jsonl` every launch (the last
`HISTORY` kept). A record holds the exact argv, the environment names specfleet set
(secret values masked), the runtime's version, the GPU placement and the sha256 of
the model and draft files. Hashing a 40 GB model takes a minute, so it runs in a
thread after the launch and is cached per file identity (`supervisor.models.identity`:
resolved path, device, inode, size, mtime and ctime; for a directory, every file under
it) in <state_dir>/hashes.json; the record is rewritten when the digests are known.

One file is hashed at a time, through one reused 1 MB buffer, so that eight targets that
start on the same model read it once (the others wait, then find its digest in the cache),
not eight times over in eight threads: with 8 MB reads that left a daemon of 8 targets at
172 MB RSS instead of 74 MB, malloc keeping each thread's arena.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.atomicfile import LOG_ONLY, StateReport, read_state, write_json, write_text
from supervisor.models.identity import file_identity, files_under

if TYPE_CHECKING:  # `specfleet status --target` reads records without the plugin contract
    from supervisor.plugin.values import LaunchSpec

HISTORY = 50
_CHUNK = 1 << 20  # larger reads are no faster, and their buffer stays in malloc's arena


@dataclass
class RunRecord:
    target: str
    started: float
    pid: int
    reason: str
    argv: list[str]
    env: dict[str, str]
    runtime: dict[str, str]
    launcher: str
    speculation: dict[str, Any]
    gpus: dict[str, Any]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> path, size, sha256
    # a ModelKit's reference, manifest and layer digests, package (registry/modelkits.py)
    modelkit: dict[str, Any] | None = None


class Cancelled(Exception):
    pass


def sha256_file(path: str, stop: threading.Event | None = None) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            if stop is not None and stop.is_set():
                raise Cancelled(path)
            digest.update(view[:n])
    return digest.hexdigest()


def sha256_dir(path: str, stop: threading.Event | None = None) -> str:
    """A digest of a model directory: each file's relative path and content, in order."""
    digest = hashlib.sha256()
    root = Path(path)
    for p in files_under(root):
        digest.update(str(p.relative_to(root)).encode() + b"\0")
        digest.update(sha256_file(str(p), stop).encode())
    return digest.hexdigest()


class RunRecorder:
    """Writes the run records and hashes.json. A write that fails (a full disk) is reported
    to `report`, never raised: the records and digests are kept here and written again when
    `report` retries. A corrupt hashes.json is set aside (`read_state`)."""

    def __init__(self, state_dir: Path, report: StateReport = LOG_ONLY) -> None:
        self.dir = state_dir / "runs"
        self.hashes_path = state_dir / "hashes.json"
        self.report = report
        self._hashes: dict[str, str] | None = None
        self._history: dict[str, list[str]] = {}  # target -> the lines of <target>.jsonl
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = threading.Event()  # a daemon that stops does not wait for a 40 GB hash
        self._hashing = asyncio.Lock()  # one file at a time (module docstring)

    def _load_hashes(self) -> dict[str, str]:
        if self._hashes is None:
            self._hashes = read_state(self.hashes_path, self.report)
        return self._hashes

    def digest(self, path: str) -> str:
        """sha256 of a model file or directory, from the cache when the file is unchanged."""
        identity = file_identity(path)
        if identity is None:
            os.stat(path)  # raises the OSError that says why
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        key = str(identity)
        cache = self._load_hashes()
        if key not in cache:
            cache[key] = (sha256_dir(path, self._stop) if os.path.isdir(path)
                          else sha256_file(path, self._stop))
            # Keep only identities of files that still exist as they were (the key's
            # first field is the resolved path).
            live = {k: v for k, v in cache.items()
                    if str(file_identity(k.split("|", 1)[0])) == k}
            self._hashes = live
            self.report.attempt(self.hashes_path.name,
                                lambda: write_json(self.hashes_path, dict(self._hashes or {})))
        return cache[key]

    def launched(self, name: str, pid: int, reason: str, spec: LaunchSpec, runtime: dict[str, str],
                 launcher: str, speculation: dict[str, Any], gpus: dict[str, Any],
                 files: dict[str, str], modelkit: dict[str, Any] | None = None) -> RunRecord:
        record = RunRecord(
            target=name, started=time.time(), pid=pid, reason=reason, argv=list(spec.argv),
            env={k: ("***" if k in spec.secret_env else v) for k, v in sorted(spec.env.items())},
            runtime=dict(runtime), launcher=launcher,
            speculation=speculation, gpus=gpus,
            files={role: {"path": p, "sha256": None} for role, p in files.items()},
            modelkit=modelkit)
        self._write(record, append=True)
        task = asyncio.create_task(self._fill_digests(record), name=f"digest:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return record

    async def _fill_digests(self, record: RunRecord) -> None:
        for info in record.files.values():
            try:
                info["size"] = os.path.getsize(info["path"])
                async with self._hashing:
                    info["sha256"] = await asyncio.to_thread(self.digest, info["path"])
            except OSError as exc:
                info["sha256"] = f"unreadable: {exc.strerror}"
            except Cancelled:
                return
        self._write(record, append=False)

    def _write(self, record: RunRecord, append: bool) -> None:
        name = record.target
        if name not in self._history:
            history = self.dir / f"{name}.jsonl"
            try:
                self._history[name] = history.read_text(errors="replace").splitlines()
            except OSError:
                self._history[name] = []
        lines = self._history[name]
        if append:
            lines.append(json.dumps(asdict(record)))
        elif lines:
            lines[-1] = json.dumps(asdict(record))  # the digests of the latest launch are known
        del lines[:-HISTORY]
        self.report.attempt(f"runs/{name}.json", lambda: self._write_files(name))

    def _write_files(self, name: str) -> None:
        """<name>.json and <name>.jsonl as they are now (again, after a failed write)."""
        lines = self._history[name]
        if not lines:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_text(self.dir / f"{name}.json", lines[-1])
        write_text(self.dir / f"{name}.jsonl", "".join(line + "\n" for line in lines))

    async def close(self) -> None:
        """Stop digests still being computed (daemon shutdown); records keep sha256 null."""
        self._stop.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def read_latest(state_dir: Path, target: str) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / "runs" / f"{target}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
