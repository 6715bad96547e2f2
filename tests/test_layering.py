"""The package's layering: imports point down (no cycle), and each module imports on its own."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import tensorbridge

PACKAGE = pathlib.Path(tensorbridge.__file__).parent
NAME = "tensorbridge"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# A wheel also carries the benchmark scripts (tensorbridge/_benchmarks): not package floors.
MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if "_benchmarks" not in p.parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: pathlib.Path) -> set[str]:
    """The package modules ``path`` imports at run time, anywhere in its body (not for typing)."""
    return _imports_in(
        path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py"
    )


def _imports_in(source: str, module: str, is_package: bool) -> set[str]:
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == NAME)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] == NAME:
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in MODULES else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    found.discard(module)
    return {m for m in found if m in MODULES}


def _graph() -> dict[str, set[str]]:
    graph = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    # Importing a submodule runs its package's __init__ first: a parent is never a dependency a
    # module can cycle through by importing it, so edges to a module's own ancestors are dropped.
    for module, deps in graph.items():
        graph[module] = {d for d in deps if not module.startswith(d + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_import_walk_sees_real_edges():
    """The walk finds the package's known imports, and none that is for typing only."""
    graph = _graph()
    assert "tensorbridge._tensor" in graph["tensorbridge._convert"]
    assert "tensorbridge._storage" in graph["tensorbridge._tensor"]
    assert "tensorbridge._tensor" not in graph["tensorbridge._dlpack_export"]  # typing only


def test_the_import_walk_sees_imports_inside_functions_and_skips_typing_ones():
    """An import in a function body or an else branch counts; one under TYPE_CHECKING does not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import _layout\n"
        "if TYPE_CHECKING:\n"
        "    from ._tensor import Tensor\n"
        "else:\n"
        "    from ._device import CPU\n"
        "def f():\n"
        "    from ._convert import asarray\n"
        "    import tensorbridge._dtype\n"
    )
    found = _imports_in(source, "tensorbridge._storage", False)
    assert found == {
        "tensorbridge._layout",
        "tensorbridge._device",
        "tensorbridge._convert",
        "tensorbridge._dtype",
    }


def test_the_cycle_finder_finds_a_cycle():
    """A two-module cycle and a three-module cycle are both reported."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_package_imports_have_no_cycle():
    """No module imports (at run time, at any depth of its body) a module that imports it back."""
    assert _cycles(_graph()) == []


def test_modules_below_tensor_do_not_import_it():
    """The export halves and the floors under Tensor never import it at run time."""
    graph = _graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return False

    below = [
        "_args", "_arrow_abi", "_arrow_export", "_buffer_export", "_cache", "_capi", "_codec", "_cuda",
        "_device", "_dlpack_abi", "_dlpack_c", "_dlpack_export", "_dtype", "_errors", "_exports", "_fields",
        "_format", "_indexing", "_interface_export", "_layout", "_memory", "_native", "_native_py", "_peers",
        "_pickle", "_shared", "_storage",
    ]  # fmt: skip
    for name in below:
        assert not reaches(f"{NAME}.{name}", f"{NAME}._tensor"), name


@pytest.mark.parametrize("module", [m for m in MODULES if m != NAME and not m.endswith("__main__")])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    """Importing any module first, with the package's __init__ replaced by an empty package, works.

    The empty package leaves the module's own imports to load everything it needs, in its own
    order: nothing may rely on __init__ having imported another module first. The CLI sits on the
    public API, so it is imported first with the real package.
    """
    code = "import importlib, sys, types\n"
    if not module.startswith(f"{NAME}.cli"):
        code += (
            f"pkg = types.ModuleType({NAME!r}); pkg.__path__ = [{str(PACKAGE)!r}]\n"
            f"sys.modules[{NAME!r}] = pkg\n"
        )
    code += f"importlib.import_module({module!r})\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
