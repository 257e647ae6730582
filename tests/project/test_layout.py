"""The package layout stays walkable (docs/architecture.md): no import cycle, no arrow from
a lower package to a higher one, small modules, classes and functions, one package per
concern, plugins on the one public import path, launchers known by their traits only.

The import graph is read from the source with `ast`, counting every import: top level,
inside functions and under TYPE_CHECKING alike, since a cycle hidden in any of them still
ties two modules together for a reader. `from pkg import name` is an edge to `pkg` itself
(its __init__ runs) and to `pkg.name` where that is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("supervisor", "plugins")
# shared/STYLE.md: 50-600 lines, one job each; a module is split by meaning, not to fit.
MAX_MODULE_LINES = 600
MAX_CLASS_METHODS = 40
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """Project modules that `path` imports (a `from pkg import mod` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    # A package's __init__ stays in the graph with its own edges: an __init__ that imports
    # its backend while the backend imports the package is a cycle a reader must untangle.
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_project_has_no_import_cycle_counting_package_inits():
    edges = graph()
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


# Lowest first: a package may import its own layer and those below, never one above.
LAYERS = (
    ("supervisor", "supervisor.errors", "supervisor.atomicfile", "supervisor.events"),
    ("supervisor.config",),
    ("supervisor.models", "supervisor.registry"),
    ("supervisor.gpu",),
    ("supervisor.plugin",),
    ("supervisor.launcher", "supervisor.tuning", "plugins"),
    ("supervisor.supervision",),
    ("supervisor.api",),
    ("supervisor.daemon", "supervisor.bench"),
    ("supervisor.cli", "supervisor.__main__"),
)


def layer_of(module: str) -> int:
    best = max((prefix for layer in LAYERS for prefix in layer
                if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)  # raises ValueError for a package missing from LAYERS


def test_no_arrow_runs_from_a_lower_package_up_to_a_higher_one():
    upward = sorted(f"{a} -> {b}" for a, deps in graph().items() for b in deps
                    if layer_of(b) > layer_of(a))
    assert upward == []


BUILT_IN_LAUNCHERS = {"process", "systemd", "external", "ray", "container"}


def test_nothing_outside_the_launchers_names_a_built_in_launcher():
    """A launcher is looked up by the fleet file's name and asked for its traits; code
    elsewhere never compares, keys or passes a launcher's name (the schema's default is
    the one place the file's default is written)."""
    named = []
    for name, path in modules().items():
        if name.startswith("supervisor.launcher"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in BUILT_IN_LAUNCHERS:
                named.append(f"{path.relative_to(REPO)} {node.value!r}")
    assert named == ["supervisor/config/schema.py 'process'"]


def test_the_launcher_name_finder_finds_a_comparison(tmp_path):
    tree = ast.parse('if target.launcher == "ray":\n    pass\n')
    assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and n.value in BUILT_IN_LAUNCHERS] == ["ray"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_longer_than_600_lines():
    long = {str(p.relative_to(REPO)): n for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_benchmark_is_longer_than_600_lines():
    """The benchmarks share their server start (serverproc.py) and keep their pure reports
    apart (load_report.py, tuner_report.py, ...): a saved run can be re-read with them."""
    long = {p.name: n for p in sorted((REPO / "benchmarks").glob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_class_has_more_than_40_methods():
    """A class past this does more than one job (the owner once had 46 methods over three
    files, mixins with stub methods included)."""
    big = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for f in node.body)
                if n > MAX_CLASS_METHODS:
                    big.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n})")
    assert big == []


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length})")
    assert long == []


def test_supervisor_has_about_a_dozen_entries_one_per_concern():
    entries = sorted(p.name for p in (REPO / "supervisor").iterdir()
                     if p.name != "__pycache__" and not p.name.startswith("__"))
    # examples/: the example fleets shipped as package data (`specfleet examples`).
    assert entries == ["api", "atomicfile.py", "bench", "cli", "config", "daemon", "errors.py",
                       "events.py", "examples", "gpu", "launcher", "models", "plugin",
                       "registry", "supervision", "tuning"]


def test_built_in_plugins_import_only_the_public_plugin_path():
    edges = graph()
    for name, deps in edges.items():
        if not name.startswith("plugins."):
            continue
        own = name.split(".")[:2]
        outside = {d for d in deps if not d.startswith(".".join(own))
                   and d != "plugins" and d != "supervisor.plugin"}
        assert outside == set(), f"{name} imports {sorted(outside)}"


def test_the_http_side_does_not_know_the_daemon():
    for name, deps in graph().items():
        if name.startswith("supervisor.api"):
            assert not {d for d in deps if d.startswith("supervisor.daemon")}, name


# Fields set on another object that are not a breach of "only an object assigns its own
# fields": a C function's prototype, which ctypes reads from the function object itself.
FOREIGN_ALLOWED = {("supervisor/daemon/memtrim.py", "argtypes"),
                   ("supervisor/daemon/memtrim.py", "restype")}


def foreign_assignments(path: Path) -> list[str]:
    """`x.field = ...` where x is neither the object itself (`self`, `cls`) nor one the same
    function has just made (`moved = type(self)(target); moved.executor = ...`): one module
    writing the state of an object that another module owns (`self.part.field` too)."""
    tree = ast.parse(path.read_text())
    scopes = [tree, *(n for n in ast.walk(tree)
                      if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    found = []
    for scope in scopes:
        made = {t.id for n in ast.walk(scope) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call) for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(scope):
            if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if not isinstance(t, ast.Attribute):
                        continue
                    base = t.value
                    if isinstance(base, ast.Name) and (base.id in ("self", "cls")
                                                       or base.id in made):
                        continue
                    where = str(path.relative_to(REPO))
                    if (where, t.attr) not in FOREIGN_ALLOWED:
                        found.append(f"{where}:{node.lineno} {ast.unparse(t)}")
    return sorted(set(found))


def test_no_module_assigns_another_objects_fields():
    """Handover, pulling and the daemon once wrote the owner's fields (`_take_over` set
    seven of them); now an owner's state changes only through its own methods."""
    found = [f for p in modules().values() for f in foreign_assignments(p)]
    assert found == []


def test_the_field_finder_finds_a_write_from_outside(tmp_path):
    module = REPO / "supervisor" / "_probe_for_test.py"
    try:
        module.write_text("def take_over(owner, new):\n    owner.process = new\n"
                          "    owner.tuner.sharing = True\n\n"
                          "def build(target):\n    moved = object()\n    moved.port = 1\n"
                          "    return moved\n")
        found = foreign_assignments(module)
    finally:
        module.unlink()
    assert [f.split(" ")[1] for f in found] == ["owner.process", "owner.tuner.sharing"]
