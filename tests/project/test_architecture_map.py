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


def definitions() -> tuple[dict[str, dict[str, set[str]]], set[str]]:
    """Per module path (`supervision/owner`, `plugins/llamacpp/backend`): its classes with
    their members; and every function, method and class name of the project."""
    import ast

    modules_: dict[str, dict[str, set[str]]] = {}
    names: set[str] = set()
    bases: dict[str, list[str]] = {}
    for path in modules():
        rel = path.relative_to(REPO).with_suffix("")
        key = "/".join(rel.parts[1:] if rel.parts[0] == "supervisor" else rel.parts)
        classes: dict[str, set[str]] = {"": set()}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
                members = {n.name for n in node.body
                           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                members |= {t.id for n in node.body if isinstance(n, ast.AnnAssign | ast.Assign)
                            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                            if isinstance(t, ast.Name)}
                members |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                            and isinstance(n.ctx, ast.Store)}  # self.field = ...
                classes[node.name] = members
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                classes[""].add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                classes[""] |= {t.id for t in (node.targets if isinstance(node, ast.Assign)
                                               else [node.target]) if isinstance(t, ast.Name)}
        modules_[key] = classes
        names |= set(classes) | {m for members in classes.values() for m in members}
    members_of = {c: m for classes in modules_.values() for c, m in classes.items() if c}
    for classes in modules_.values():  # what a class inherits from the project's classes
        for cls in list(classes):
            todo = list(bases.get(cls, []))
            while todo:
                base = todo.pop()
                classes[cls] = classes[cls] | members_of.get(base, set())
                todo += bases.get(base, [])
    return modules_, names


def walk_references(text: str) -> list[str]:
    """The code the walks name: `pkg/module.Name[.member]`, `Class.member` and `_private`
    (other backticked words are settings, states and values)."""
    walks = text[text.index("## Four walks"):text.index("## Commands and states")]
    return [t for t in re.findall(r"`([^`]+)`", walks)
            if re.fullmatch(r"[a-z_]+(/[a-z_]+)+\.[A-Za-z_][\w.]*|[a-z_]+\.[a-z_]\w*"
                            r"|[A-Z]\w*\.\w+|_\w+", t)]


def unknown_references(text: str) -> list[str]:
    mods, names = definitions()
    bad = []
    for ref in walk_references(text):
        if ref.endswith(".py"):
            continue  # a file: named by the module check above
        if "/" in ref:
            module, _, rest = ref.partition(".")
            classes = mods.get(module)
            first, _, member = rest.partition(".")
            if classes is None or not (first in classes or first in classes[""]) or (
                    member and first in classes and member not in classes[first]):
                bad.append(ref)
        elif "." in ref and ref[0].islower():  # module.name, where a module has that stem
            stem, _, name = ref.partition(".")
            found = [c for m, c in mods.items() if m.rsplit("/", 1)[-1] == stem]
            if found and not any(name in members for c in found for members in c.values()):
                bad.append(ref)
        elif ref[0].isupper():
            cls, _, member = ref.partition(".")
            owners = [c for m in mods.values() for name, c in m.items() if name == cls]
            if not any(member in c for c in owners) and not (cls == "Command" and member.isupper()):
                bad.append(ref)
        elif ref not in names:
            bad.append(ref)
    return bad


def test_every_function_and_class_the_walks_name_exists():
    """The walks once named `_start_process` and `replace_beside` after both were gone."""
    assert unknown_references(MAP.read_text()) == []


def test_the_walk_checker_finds_a_name_that_is_gone():
    text = ("## Four walks\n`supervision/owner.TargetSupervisor._run_once` → `_launch` → "
            "`supervision/handover.replace_beside` → `TargetSupervisor._start_process` and "
            "`_gone_helper`\n## Commands and states\n")
    assert unknown_references(text) == ["supervision/handover.replace_beside",
                                        "TargetSupervisor._start_process", "_gone_helper"]
