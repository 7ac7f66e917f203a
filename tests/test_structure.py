"""The package's shape (CONTRIBUTING.md, "Before you push"): no class over 300 lines, no function over 80, and no
import cycle among the ``unifiedplayers`` modules, read from the source with ``ast`` (nothing is imported).

A cycle counts module-level imports only: an import inside a function runs when the function does, and one under
``if TYPE_CHECKING:`` never runs. ``import a.b`` and ``from a.b import c`` are edges to ``a.b`` (to ``a.b.c`` when
that is a module); the parent packages a dotted import also runs are not counted.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "unifiedplayers"
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80

# Known offenders, each with the reason it stays. "module:qualified.name" -> why. Keep it short: a new entry
# needs a reason a reviewer accepts, and an entry whose offence is gone fails below until it is removed.
ALLOWED: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in MODULES.items()}


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


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top-level statements, into ``if``/``try``/``with``
    blocks but not into functions, classes or ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                out.append(stmt)
            elif isinstance(stmt, ast.If):
                if not is_type_checking(stmt.test):
                    visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                    visit(block)
            elif isinstance(stmt, ast.With):
                visit(stmt.body)

    visit(tree.body)
    return out


def imported_modules(module: str, tree: ast.Module) -> set[str]:
    """The package's modules that ``module`` imports at module level."""
    is_package = MODULES[module].name == "__init__.py"
    targets: set[str] = set()
    for node in module_level_imports(tree):
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
            targets.add(submodule if submodule in MODULES else base)
    return {t for t in targets if t in MODULES and t != module}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan), each as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [cycle_path(graph, set(c)) for c in components]


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


def test_the_package_is_found():
    assert f"{PACKAGE}.loop" in MODULES and f"{PACKAGE}.config" in MODULES


def test_no_class_over_300_lines_and_no_function_over_80():
    found = [f for name, tree in TREES.items() for f in oversized(tree, name)]
    offenders = [f"{kind} {where}: {lines} lines" for kind, where, lines in found if where not in ALLOWED]
    assert not offenders, ("over the limit (split it, or add it to ALLOWED with a reason):\n"
                           + "\n".join(offenders))
    stale = sorted(set(ALLOWED) - {where for _, where, _ in found})
    assert not stale, f"ALLOWED lists what is no longer over the limit; remove: {stale}"


def test_no_import_cycle_among_the_package_modules():
    graph = {name: imported_modules(name, tree) for name, tree in TREES.items()}
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (module-level imports):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checks_catch_what_they_look_for():
    """The checks themselves: a long function, a cycle, and a TYPE_CHECKING import that is not one."""
    long_function = ast.parse("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert oversized(long_function, "m") == [("function", "m:f", MAX_FUNCTION_LINES + 1)]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    guarded = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
                        "def g():\n    import z\n")
    assert [a.names[0].name for a in module_level_imports(guarded)] == ["TYPE_CHECKING", "y"]
