"""Write files so that a reader never sees half a file: a temporary file, then rename."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text`; the file is created with `mode` from the start (a secret
    written 0600 is never readable by others, not even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)  # O_CREAT's mode is reduced by the umask
    tmp.replace(path)


def write_json(path: Path, data: Any, indent: int | None = None) -> None:
    write_text(path, json.dumps(data, indent=indent))
