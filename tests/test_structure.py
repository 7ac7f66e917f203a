"""The package's shape (CONTRIBUTING.md, "Before you push"), read from the source with ``ast`` (nothing is imported):

- no class over 300 lines and no function over 80 in ``src/``, ``eval/``, ``ablations/`` and ``benchmarks/``;
- no import cycle among the modules of ``src/``, ``eval/``, ``ablations/`` and ``benchmarks/``;
- no cycle among the parts of the package (its top-level modules and folders: ``loop`` ↔ ``checks`` is one even when
  no two modules import each other), and the package imports none of the tools beside it.

Every import counts, at a module's top or inside a function or class (it runs when the function does, and hides a
dependency there); one under ``if TYPE_CHECKING:`` never runs and does not count. ``import a.b`` and ``from a.b
import c`` are edges to ``a.b`` (to ``a.b.c`` when that is a module); the parent packages a dotted import also runs are
not counted. The tools are packages run from the repository's root (``python -m benchmarks.gpu_check``), so their
imports name them in full (``from benchmarks import cuda_peak``). A module loaded from its path (``importlib``) is no
import this test can see.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterable

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "unifiedplayers"
TOOLS = ("eval", "ablations", "benchmarks")  # beside the package: they import it, never the reverse
SIZED = TOOLS  # the tools are held to the package's size limits too
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80

# Known offenders, each with the reason it stays. "module:qualified.name" -> why. Keep it short: a new entry
# needs a reason a reviewer accepts, and an entry whose offence is gone fails below until it is removed.
ALLOWED: dict[str, str] = {}
# Known cycles among the package's parts, each with the reason it stays: the parts of the cycle -> why.
ALLOWED_PART_CYCLES: dict[frozenset[str], str] = {}


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


MODULES = {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}
TREES = {name: _parse(path) for name, path in MODULES.items()}
TOOL_MODULES = {module_name(p, ROOT): p for tool in TOOLS for p in sorted((ROOT / tool).rglob("*.py"))
                if "__pycache__" not in p.parts}
TOOL_TREES = {name: _parse(path) for name, path in TOOL_MODULES.items()}
ALL_MODULES = {**MODULES, **TOOL_MODULES}


def oversized(tree: ast.Module, module: str) -> list[tuple[str, str, int]]:
    """``(kind, "module:qualname", lines)`` of every class over MAX_CLASS_LINES and function over
    MAX_FUNCTION_LINES (methods and nested functions included; a decorator's lines do not count)."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                is_class = isinstance(child, ast.ClassDef)
                if lines > (MAX_CLASS_LINES if is_class else MAX_FUNCTION_LINES):
                    found.append(("class" if is_class else "function", f"{module}:{name}", lines))
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import a module can run: at its top, in ``if``/``try``/``with`` blocks, inside functions and classes;
    not those under ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(child)
            elif isinstance(child, ast.If) and is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]))
            else:
                visit(child)

    visit(tree)
    return out


def imported_modules(module: str, tree: ast.Module, modules: dict[str, Path] = ALL_MODULES) -> set[str]:
    """The modules of ``modules`` that ``module`` imports, anywhere in it."""
    is_package = modules[module].name == "__init__.py"
    targets: set[str] = set()
    for node in imports(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: from the module's package, one level up per extra dot
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, *([base] if base else [])])
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != module}


def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports, over the package and the tools."""
    return {name: imported_modules(name, tree) for name, tree in {**TREES, **TOOL_TREES}.items()}


def part(module: str) -> str:
    """The part of the package a module belongs to: ``unifiedplayers.loop`` for ``unifiedplayers.loop.outer``."""
    return ".".join(module.split(".")[:2])


def part_graph(graph: dict[str, set[str]], modules: Iterable[str] = MODULES) -> dict[str, set[str]]:
    """part -> the parts its modules import, over ``modules`` (the package's)."""
    modules = set(modules)
    out: dict[str, set[str]] = {part(m): set() for m in modules}
    for m in modules:
        out[part(m)] |= {part(t) for t in graph[m] if t in modules and part(t) != part(m)}
    return out


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one node (Tarjan): each is a set of nodes on a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(set(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module, each as a path."""
    return [cycle_path(graph, c) for c in components(graph)]


def cycle_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A readable cycle inside ``component``: a -> b -> ... -> a."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in component)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return [*path, start]
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return [*path, start]
        path.append(fresh[0])
        seen.add(fresh[0])


def test_the_package_and_the_tools_are_found():
    assert f"{PACKAGE}.loop" in MODULES and f"{PACKAGE}.config" in MODULES
    assert {"eval.run", "ablations.sweeps", "benchmarks.gpu_check"} <= set(TOOL_MODULES)


def test_no_class_over_300_lines_and_no_function_over_80():
    sized = {**TREES, **{name: tree for name, tree in TOOL_TREES.items() if name.split(".")[0] in SIZED}}
    assert "benchmarks.gpu_check" in sized
    found = [f for name, tree in sized.items() for f in oversized(tree, name)]
    offenders = [f"{kind} {where}: {lines} lines" for kind, where, lines in found if where not in ALLOWED]
    assert not offenders, ("over the limit (split it, or add it to ALLOWED with a reason):\n"
                           + "\n".join(offenders))
    stale = sorted(set(ALLOWED) - {where for _, where, _ in found})
    assert not stale, f"ALLOWED lists what is no longer over the limit; remove: {stale}"


def test_no_import_cycle_among_the_modules():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (imports anywhere in a module):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_among_the_package_parts():
    graph = part_graph(import_graph())
    found = components(graph)
    cycles = [" -> ".join(cycle_path(graph, c)) for c in found if frozenset(c) not in ALLOWED_PART_CYCLES]
    assert not cycles, ("import cycles among the package's parts (make the dependency one-way, or add the cycle to "
                        "ALLOWED_PART_CYCLES with a reason):\n" + "\n".join(cycles))
    stale = [sorted(c) for c in ALLOWED_PART_CYCLES if c not in {frozenset(f) for f in found}]
    assert not stale, f"ALLOWED_PART_CYCLES lists what is no longer a cycle; remove: {stale}"


def test_the_package_imports_none_of_the_tools():
    graph = import_graph()
    found = sorted(f"{m} -> {t}" for m in MODULES for t in graph[m] if t in TOOL_MODULES)
    assert not found, found


def path_edits(text: str) -> list[str]:
    """The lines of a module that edit ``sys.path`` (assignments, insert, append, extend), outside string literals'
    code meant for another interpreter (the sandbox's escape attempts)."""
    edit = re.compile(r"^\s*sys\.path(\.(insert|append|extend)\(|\[[^\]]*\]\s*=)")
    return [line.strip() for line in text.splitlines() if edit.search(line)]


def test_no_test_module_edits_sys_path():
    """The tests are packages and import their shared helpers by full name (``tests.players.scripted``)."""
    tests = ROOT / "tests"
    found = [f"{p.relative_to(ROOT)}: {line}" for p in sorted(tests.rglob("*.py")) for line in path_edits(p.read_text())]
    assert found == []
    missing = sorted(str(d.relative_to(ROOT)) for d in {p.parent for p in tests.rglob("*.py")}
                     if "__pycache__" not in d.parts and not (d / "__init__.py").exists())
    assert missing == [], "a test folder without __init__.py is not a package"
    assert path_edits("import sys\nsys.path.insert(0, 'x')\n    sys.path[:0] = ['y']\n") == [
        "sys.path.insert(0, 'x')", "sys.path[:0] = ['y']"]


def test_the_checks_catch_what_they_look_for():
    """The checks themselves: a long function, a cycle, an import inside a function that is one and a TYPE_CHECKING
    import that is not, a tool's imports of its own modules by their full names (a bare name is another module), a
    cycle between two parts whose modules import each other one way."""
    long_function = ast.parse("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert oversized(long_function, "m") == [("function", "m:f", MAX_FUNCTION_LINES + 1)]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    guarded = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
                        "def g():\n    import z\n")
    assert [a.names[0].name for a in imports(guarded)] == ["TYPE_CHECKING", "y", "z"]
    tools = {"benchmarks": Path("__init__.py"), "benchmarks.a": Path("a.py"), "benchmarks.b": Path("b.py"),
             "benchmarks.c": Path("c.py"), "b": Path("b.py")}
    code = "def f():\n    from benchmarks.b import g\n    from benchmarks import c\n    import b\n"
    assert imported_modules("benchmarks.a", ast.parse(code), tools) == {"benchmarks.b", "benchmarks.c", "b"}
    modules = {f"{PACKAGE}.x.a": {f"{PACKAGE}.y"}, f"{PACKAGE}.y": {f"{PACKAGE}.x.b"}, f"{PACKAGE}.x.b": set()}
    assert import_cycles(modules) == []  # no two modules import each other, yet x -> y -> x
    assert components(part_graph(modules, modules)) == [{f"{PACKAGE}.x", f"{PACKAGE}.y"}]
