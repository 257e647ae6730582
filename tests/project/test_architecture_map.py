"""docs/architecture.md is the map a newcomer reads first: every package and module of the
project is named in it, on a line that also names its package, so that the map cannot fall
behind the code unnoticed (it once omitted a dozen modules and named a renamed function)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "architecture.md"


def modules() -> list[Path]:
    return sorted(p for package in ("supervisor", "plugins") for p in (REPO / package).rglob("*.py")
                  if p.name != "__init__.py")


def named(path: Path, lines: list[str]) -> bool:
    """Whether a line of the map names the module and its top-level package: `owner.py`,
    `owner.TargetSupervisor` or `supervision/owner` beside `supervision/`."""
    parts = path.relative_to(REPO).parts
    package = parts[1] if parts[0] == "supervisor" and len(parts) > 2 else parts[0]
    if package.endswith(".py"):  # supervisor/errors.py and the like: named as a file
        package = path.name
    stem = re.escape(path.stem)
    mention = re.compile(rf"(?<![\w-]){stem}(\.py\b|`|\.[A-Za-z_])")
    return any(mention.search(line) and (package in line) for line in lines)


def test_every_module_is_named_in_the_architecture_map():
    lines = MAP.read_text().splitlines()
    missing = [str(p.relative_to(REPO)) for p in modules() if not named(p, lines)]
    assert missing == []


def test_every_package_is_named_in_the_architecture_map():
    text = MAP.read_text()
    packages = sorted({p.parent.relative_to(REPO) for p in modules()})
    missing = [str(p) for p in packages
               if f"{p}/" not in text and f"{p.name}/" not in text]
    assert missing == []


def test_the_finder_misses_a_module_the_map_does_not_name():
    lines = ["| `supervisor/tuning/` | acceptance `window.py` |"]
    assert named(REPO / "supervisor" / "tuning" / "window.py", lines)
    assert not named(REPO / "supervisor" / "tuning" / "drift.py", lines)
    assert not named(REPO / "supervisor" / "gpu" / "window.py", lines)  # not its package
