"""Which file is this: the one identity behind every per-file cache.

A model header, a sha256 digest, a runtime's `--help` text and a tuning baseline are
all kept per file and reused while "the same file" is there. The same file means:

- the same resolved path (symlinks followed, so a link and its target agree),
- the same device and inode (a file replaced by rename is a new inode),
- the same size, modification time and status-change time, in nanoseconds.

The status-change time (ctime) is there because the modification time alone can be
put back: `cp -p`, `rsync -t` or `touch -r` rewrite a file in place with the same size
and restore its old mtime, but the kernel sets ctime on every write, rename, chmod or
utime and nothing can set it back. The price is that a `chmod` also counts as a new
file (one more digest or baseline measurement): safe, and rare on model files.

A directory (a Hugging Face model) is the same when it and every file under it are:
`contents` is a digest over the relative path and identity of each file, in the order
`files_under` lists them, which is also the order its sha256 covers them.

`str(identity)` is the stable text form kept in JSON state files (run-record digests,
tuning baselines): `<path>|<device>:<inode>|<size>|<mtime_ns>|<ctime_ns>`, then
`|tree:<digest>` for a directory. The path comes first and holds no field of its own.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileIdentity:
    path: str  # resolved: symlinks followed
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    contents: str = ""  # directories: digest over the identities of the files under it

    def __str__(self) -> str:
        text = f"{self.path}|{self.device}:{self.inode}|{self.size}|{self.mtime_ns}|{self.ctime_ns}"
        return f"{text}|tree:{self.contents}" if self.contents else text


def file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """The identity of a file or directory (`~` expanded), or None when it cannot be read."""
    try:
        expanded = os.path.expanduser(path)
        st = os.stat(expanded)  # "" is no file (its realpath would be the working directory)
        resolved = os.path.realpath(expanded)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    contents = _tree_digest(Path(resolved)) if os.path.isdir(resolved) else ""
    return FileIdentity(path=resolved, device=st.st_dev, inode=st.st_ino, size=st.st_size,
                        mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, contents=contents)


def files_under(root: Path) -> list[Path]:
    """The files of a directory tree in a stable order (what a directory's digest covers)."""
    return sorted(q for q in root.rglob("*") if q.is_file())


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for p in files_under(root):
        member = file_identity(p)
        text = f"{p.relative_to(root)}\0{member if member else '-'}\n"
        digest.update(text.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]
