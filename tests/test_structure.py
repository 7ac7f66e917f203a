"""The package's shape (CONTRIBUTING.md, "Before you push"), read from the source with ``ast`` (nothing is imported):

- in ``src/``, ``eval/``, ``ablations/`` and ``benchmarks/``: the longest class and function are printed (size is a
  guide, not a wall), and none passes MAX_CLASS_LINES or MAX_FUNCTION_LINES; no class reads an attribute of ``self``
  that neither it nor a class it derives from defines (a mixin sharing another class's state: join them);
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
from typing import Iterable, Optional

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "unifiedplayers"
TOOLS = ("eval", "ablations", "benchmarks")  # beside the package: they import it, never the reverse
MAX_CLASS_LINES = 600
MAX_FUNCTION_LINES = 120
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


def sizes(tree: ast.Module, module: str) -> list[tuple[str, str, int]]:
    """``(kind, "module:qualname", lines)`` of every class and function (methods and nested functions included; a
    decorator's lines do not count)."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                found.append((kind, f"{module}:{name}", child.end_lineno - child.lineno + 1))
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def oversized(found: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    return [f for f in found if f[2] > (MAX_CLASS_LINES if f[0] == "class" else MAX_FUNCTION_LINES)]


def unowned_attributes(trees: Iterable[ast.Module]) -> dict[str, list[str]]:
    """``class name -> the attributes of self it reads`` that neither it nor its bases define (methods, class
    attributes, assignments to ``self.x``), over the classes whose bases are all among ``trees``' classes: a mixin
    that reads the state of the class it is mixed into."""
    classes: dict[str, list[ast.ClassDef]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)

    def self_attributes(cls: ast.ClassDef, ctx: tuple[type, ...]) -> set[str]:
        return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "self" and isinstance(n.ctx, ctx) and not n.attr.startswith("__")}

    def defined(cls: ast.ClassDef) -> Optional[set[str]]:
        """What ``cls`` and its bases define; None when a base is not a class of ``trees``."""
        names = self_attributes(cls, (ast.Store, ast.Del))
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            if name not in classes:
                return None
            for base_cls in classes[name]:
                inherited = defined(base_cls)
                if inherited is None:
                    return None
                names |= inherited
        return names

    found = {}
    for name, nodes in classes.items():
        for cls in nodes:
            names = defined(cls)
            missing = sorted(self_attributes(cls, (ast.Load,)) - names) if names is not None else []
            if missing:
                found[name] = missing
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


SIZED_TREES = {**TREES, **TOOL_TREES}  # the tools are held to the package's limits too


def test_the_longest_class_and_function_are_reported_and_within_the_limits():
    """Size is a guide: the longest class and function are printed (``pytest -s``) for a reviewer to look at; only a
    class over MAX_CLASS_LINES or a function over MAX_FUNCTION_LINES fails. Never split a class into parts that
    share its state just to shorten it."""
    assert "benchmarks.gpu_check" in SIZED_TREES
    found = [f for name, tree in SIZED_TREES.items() for f in sizes(tree, name)]
    for kind in ("class", "function"):
        _, where, lines = max((f for f in found if f[0] == kind), key=lambda f: f[2])
        print(f"longest {kind}: {where}, {lines} lines")
    offenders = [f"{kind} {where}: {lines} lines" for kind, where, lines in oversized(found)]
    assert not offenders, "over the limit:\n" + "\n".join(offenders)


def test_no_class_reads_state_it_does_not_define():
    found = unowned_attributes(SIZED_TREES.values())
    assert not found, f"classes that read attributes of self defined elsewhere (mixins; join them): {found}"


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
    long_function = ast.parse("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "class C:\n    y = 1\n")
    assert sizes(long_function, "m") == [("function", "m:f", MAX_FUNCTION_LINES + 1), ("class", "m:C", 2)]
    assert oversized(sizes(long_function, "m")) == [("function", "m:f", MAX_FUNCTION_LINES + 1)]
    mixin = ast.parse("class Part:\n    def g(self):\n        return self._state + self.h()\n"
                      "class Whole(Part):\n    def __init__(self):\n        self._state = 1\n    def h(self):\n"
                      "        return self._state\n"
                      "class Outside(nn.Module):\n    def f(self):\n        return self.training\n")
    assert unowned_attributes([mixin]) == {"Part": ["_state", "h"]}
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
