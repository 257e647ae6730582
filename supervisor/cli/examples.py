"""`specfleet examples`: the example fleets shipped in the package, listed, or copied into
a directory to edit (an installed specfleet has no checkout to read them from)."""

from __future__ import annotations

import argparse
import shutil
from importlib import resources
from pathlib import Path

from supervisor.errors import SpecfleetError


def shipped() -> Path:
    """The directory of the examples inside the installed package."""
    return Path(str(resources.files("supervisor") / "examples"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("examples", help="list the example fleets, or copy them to a directory",
                       description="The example fleet files shipped with specfleet (the quick "
                       "start, draft-model pairs, on-demand swapping, systemd, containers, Ray, "
                       "vLLM, Ollama, ModelKits) and the Grafana dashboard: listed with the "
                       "first line of each, or copied with --copy DIR (an existing file is "
                       "left alone and named).")
    p.add_argument("--copy", metavar="DIR", help="copy them into DIR (made if missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    files = sorted(p for p in shipped().iterdir() if p.suffix in (".yaml", ".json"))
    if not args.copy:
        print(f"shipped in {shipped()}:")
        for path in files:
            print(f"  {path.name:<24} {_first_line(path)}")
        print("copy them with: specfleet examples --copy DIR")
        return 0
    target = Path(args.copy).expanduser()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecfleetError(f"cannot make {target}: {exc.strerror or exc}") from None
    kept = []
    for path in files:
        dest = target / path.name
        if dest.exists():
            kept.append(dest.name)
            continue
        shutil.copyfile(path, dest)
    print(f"copied {len(files) - len(kept)} example(s) into {target}"
          + (f"; left alone (already there): {', '.join(kept)}" if kept else ""))
    return 0


def _first_line(path: Path) -> str:
    """An example's description: its first comment line (a dashboard: its title)."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if '"title"' in line:
            return "the Grafana dashboard: " + line.split(":", 1)[1].strip().strip('",')
    return ""
