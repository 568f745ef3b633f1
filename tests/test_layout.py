"""The code's shape: no import cycle among the project's own modules in cli/ and libs/, and no
module over 500 lines outside generated code.

The import graph counts every ``import`` statement of a module, at module level or inside a
function. A function-level import defers a cycle to run time; it does not remove it: the two
modules still need each other, cannot be understood or moved apart, and the deferred import is
where the lower layer reaches back up (``format_table`` and the address resolver lived in
``main.py``, and search, eval and loadtest imported them from inside functions).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Package name -> its directory, for the packages whose imports must form no cycle.
LAYERED_PACKAGES = {
    "ragmesh_cli": ROOT / "cli" / "ragmesh_cli",
    "meshkit": ROOT / "libs" / "meshkit",
    "ragmesh_client": ROOT / "clients" / "python" / "src" / "ragmesh_client",
}
MAX_LINES = 500
SKIPPED_DIRS = {"gen", "_pb", ".venv", "node_modules", "build", "dist", "__pycache__"}
# ---------------------------------------------------------------------------- import graph


def module_files(package: str, directory: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its __init__)."""
    modules: dict[str, Path] = {}
    for path in sorted(directory.rglob("*.py")):
        parts = list(path.relative_to(directory).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def parse(path: Path) -> ast.Module:
    """The module's syntax tree. CPython 3.11 builds AST objects against one counter per
    interpreter (gh-106905): a parse that overlaps another thread's can fail with a spurious
    "AST constructor recursion depth mismatch" SystemError; the same parse again succeeds."""
    source = path.read_text()
    try:
        return ast.parse(source, str(path))
    except SystemError:
        return ast.parse(source, str(path))


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name the module imports, anywhere in it; ``from a import b`` yields ``a.b``
    (the submodule when there is one, else resolved to ``a`` by the caller)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (the longest known prefix of each name)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in imported_names(name, path):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle as a path that ends where it starts, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def layered_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, directory in LAYERED_PACKAGES.items():
        modules.update(module_files(package, directory))
    return modules


def test_no_import_cycle_in_cli_or_libs() -> None:
    cycle = find_cycle(import_graph(layered_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "main.py").write_text("from pkg.sub import low\n\ndef table():\n    return 1\n")
    (package / "sub" / "low.py").write_text("def f():\n    from ..main import table\n    return table()\n")
    graph = import_graph(module_files("pkg", package))
    assert graph["pkg.main"] == {"pkg.sub.low"}
    assert graph["pkg.sub.low"] == {"pkg.main"}
    assert find_cycle(graph) in (
        ["pkg.main", "pkg.sub.low", "pkg.main"],
        ["pkg.sub.low", "pkg.main", "pkg.sub.low"],
    )
    (package / "sub" / "low.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(module_files("pkg", package))) is None


def test_lower_layer_imports_no_command_module() -> None:
    """The CLI's ground floor (tables, statistics, datasets, addresses, stack state, channels,
    documents) never imports a command: every command may import all of it."""
    lower = [
        "tables",
        "stats",
        "datasets",
        "addresses",
        "state",
        "channels",
        "documents",
        "metrics",
        "procutil",
    ]
    commands = {"main", "search", "ask", "ingest", "evaluation", "answer_eval", "loadtest", "stack", "config"}
    modules = layered_modules()
    graph = import_graph(modules)
    for name in lower:
        module = f"ragmesh_cli.{name}"
        reached = reachable(graph, module)
        upward = sorted(m for m in reached if m.startswith("ragmesh_cli.") and m.split(".")[1] in commands)
        assert not upward, f"{module} reaches command modules {upward}"


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# ---------------------------------------------------------------------------- meshkit's floors

# meshkit's packages, ground floor first: each imports only its own package and those below it
# (libs/meshkit/README.md). A name not here is a package nobody placed: the test says so.
MESHKIT_FLOORS = ("settings", "core", "domain", "text", "inference", "rpc", "storage", "replication", "llm")


def meshkit_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: Mapping[str, set[str]], floors: tuple[str, ...]) -> list[str]:
    """``a -> b`` for every import of a meshkit module from a package above its own."""
    floor = {name: i for i, name in enumerate(floors)}
    found = []
    for module, imported in sorted(graph.items()):
        own = meshkit_package(module)
        if not module.startswith("meshkit.") or own is None:
            continue
        for target in sorted(imported):
            other = meshkit_package(target)
            if target.startswith("meshkit.") and other is not None and floor[other] > floor[own]:
                found.append(f"{module} -> {target}")
    return found


def test_meshkit_packages_import_only_downward() -> None:
    modules = {m: p for m, p in layered_modules().items() if m.startswith("meshkit")}
    packages = {meshkit_package(m) for m in modules} - {None}
    assert packages == set(MESHKIT_FLOORS), f"unplaced packages: {sorted(packages - set(MESHKIT_FLOORS))}"
    # Every package is a folder with a README saying what it owns and who may import it.
    for package in MESHKIT_FLOORS:
        assert (LAYERED_PACKAGES["meshkit"] / package / "README.md").is_file(), package
    assert not upward_imports(import_graph(modules), MESHKIT_FLOORS)


def test_the_floor_check_sees_an_upward_import() -> None:
    graph = {"meshkit.core.errors": {"meshkit.rpc.tracing"}, "meshkit.rpc.tracing": {"meshkit.core.logs"}}
    assert upward_imports(graph, MESHKIT_FLOORS) == ["meshkit.core.errors -> meshkit.rpc.tracing"]


# ---------------------------------------------------------------------------- walls between services

SERVICES_DIR = ROOT / "services"
# A service shows the others only this module (docs/ARCHITECTURE.md, "What a service shows").
PUBLIC_MODULE = "public"


def service_modules() -> dict[str, Path]:
    """Every non-test module of services/ and the CLI, by dotted name."""
    modules = {m: p for m, p in module_files("services", SERVICES_DIR).items() if "tests" not in m.split(".")}
    modules.update(module_files("ragmesh_cli", LAYERED_PACKAGES["ragmesh_cli"]))
    return {m: p for m, p in modules.items() if "tests" not in m.split(".")}


def service_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "services" and len(parts) > 1 else None


def reaches_into_another_service(module: str, imported: str) -> bool:
    """Whether ``module`` imports another service's module other than its public one."""
    target = service_of(imported)
    if target is None or target == service_of(module):
        return False
    parts = imported.split(".")
    return len(parts) > 2 and parts[2] != PUBLIC_MODULE


def cross_service_imports(graph: Mapping[str, set[str]]) -> list[str]:
    return [
        f"{module} -> {imported}"
        for module, targets in sorted(graph.items())
        for imported in sorted(targets)
        if reaches_into_another_service(module, imported)
    ]


def test_no_service_reaches_into_another() -> None:
    """Services and the CLI import, of another service, only its public module (tests and
    bench scripts may start a service in-process)."""
    graph = import_graph({**service_modules(), **module_files("services", SERVICES_DIR)})
    own = set(service_modules())
    assert not cross_service_imports({m: t for m, t in graph.items() if m in own})


def test_the_wall_check_sees_a_servicer_import() -> None:
    graph = {
        "services.gateway.planning": {"services.planner.servicer", "services.planner.public"},
        "ragmesh_cli.ingest": {"services.ingestion.chunking"},
    }
    assert cross_service_imports(graph) == [
        "ragmesh_cli.ingest -> services.ingestion.chunking",
        "services.gateway.planning -> services.planner.servicer",
    ]


ANSWER_WING = "services.gateway.answer"
# The gateway's modules that wire both wings together.
GATEWAY_WIRING = {"services.gateway.servicer", "services.gateway.__main__"}


def test_the_search_wing_never_imports_the_answer_wing() -> None:
    modules = {
        m: p for m, p in module_files("services", SERVICES_DIR).items() if m.startswith("services.gateway")
    }
    modules = {m: p for m, p in modules.items() if "tests" not in m.split(".")}
    assert any(m.startswith(ANSWER_WING + ".") for m in modules), "no answer wing found"
    graph = import_graph(modules)
    search = [m for m in modules if not m.startswith(ANSWER_WING) and m not in GATEWAY_WIRING]
    crossing = sorted(f"{m} -> {t}" for m in search for t in graph[m] if t.startswith(ANSWER_WING))
    assert not crossing, crossing


MAX_GATEWAY_CLASS_LINES = 150


def test_no_gateway_class_over_150_lines() -> None:
    oversized = []
    for path in (SERVICES_DIR / "gateway").rglob("*.py"):
        if "tests" in path.parts:
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_GATEWAY_CLASS_LINES:
                    oversized.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not oversized, oversized


# ---------------------------------------------------------------------------- module size


def python_files() -> Iterator[Path]:
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        yield from (Path(directory) / f for f in files if f.endswith(".py"))


def line_count(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def oversized_modules() -> dict[str, int]:
    counts = {str(p.relative_to(ROOT)): line_count(p) for p in python_files()}
    return {path: lines for path, lines in sorted(counts.items()) if lines > MAX_LINES}


def test_no_module_over_500_lines() -> None:
    oversized = oversized_modules()
    assert not oversized, f"modules over {MAX_LINES} lines (split them by concern): {oversized}"


@pytest.mark.parametrize("directory", ["cli", "libs"])
def test_cli_and_libs_are_covered(directory: str) -> None:
    """The walk really sees the trees the limit is about."""
    assert any(str(p.relative_to(ROOT)).startswith(f"{directory}/") for p in python_files())
