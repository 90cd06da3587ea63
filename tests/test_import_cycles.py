"""No import cycle anywhere in the product: every import of the installable folders (under their respawn.* names,
pyproject.toml's package-dir) and of bench/, at module level or inside a function, read from the source with ast.
An import inside a function is an edge like any other: moving one there hides a cycle, it does not break it. So is an
import under `if TYPE_CHECKING:`, as import-linter counts it: a type named across a cycle is a cycle of the design.

`python -m tests.test_import_cycles` prints every cycle found, one per line."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from deploy import layout

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_PACKAGES = {"bench": "bench"}  # never installed, but product code all the same (docs/performance.md)


def _modules() -> dict[str, Path]:
    """Every product module's import name -> its file (a package is its __init__.py)."""
    return layout.module_files({**layout.package_dirs(ROOT), **{p: ROOT / f for p, f in CHECKOUT_PACKAGES.items()}})


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules `name` imports anywhere in its file: `from P import x` is P.x where that is a module,
    else P (for a package, its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` where c is a name, or an external package
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def components(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found, key=min)


def cycle(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest cycle through the component's first module (sorted), the first module repeated last."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while not any(start in edges[v] for v in frontier):  # breadth first: the component holds a way back
        reached = []
        for v in frontier:
            for w in sorted((edges[v] & component) - paths.keys()):
                paths[w] = [*paths[v], w]
                reached.append(w)
        frontier = reached
    return [*paths[next(v for v in frontier if start in edges[v])], start]


def test_the_product_has_no_import_cycle():
    edges = graph()
    found = [" -> ".join(cycle(c, edges)) for c in components(edges)]
    assert not found, "import cycles (module-level and inside functions alike); move the shared piece down into a " \
                      "module both can import, or pass the value in:\n" + "\n".join(found)


def test_an_import_inside_a_function_and_a_name_from_a_package_are_edges(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import A\n")
    (package / "a.py").write_text("A = 1\n\ndef f():\n    from pkg import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import A\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py"}
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert edges == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg"}}
    [members] = components(edges)
    assert cycle(members, edges) == ["pkg", "pkg.a", "pkg.b", "pkg"]


if __name__ == "__main__":
    edges = graph()
    for members in components(edges):
        print(" -> ".join(cycle(members, edges)), f"({len(members)} modules: {', '.join(sorted(members))})")
