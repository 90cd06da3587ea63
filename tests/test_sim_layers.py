"""The sim's layers (issue #49 item 3): its services know the runtime SimServer hands them (sim/runtime.py), never
the server, and no class in sim/ grows past 400 lines.

An import-linter contract cannot say the first: pyproject.toml's contracts are checked on the installed wheel
(.ci/lint-imports), which holds no sim/, and root_packages is one list for every contract, so a `sim` root fails the
wheel's check while the checkout's layout fails the respawn.* ones. Hence this test reads the imports itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[1] / "sim"
# What drives a SimServer rather than serving in it: the command line, the HTTP routing (its handler is given the
# server) and the demo.
DRIVERS = {"server.py", "__main__.py", "http_api.py"}
MAX_CLASS_LINES = 400
# Not split yet (the demo's driver, outside the sim's services and server): to go when it is.
KNOWN_LONG = {"sim/demo/runner.py:DemoRun"}


def _modules() -> list[Path]:
    return sorted(p for p in SIM.glob("*.py") if p.name not in DRIVERS)


def _imported(tree: ast.AST) -> set[str]:
    """Every module the file imports, TYPE_CHECKING blocks and function bodies included (`from sim import server`
    counts as sim.server)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_no_sim_service_imports_the_server(path):
    imported = _imported(ast.parse(path.read_text(), filename=str(path)))
    assert not {n for n in imported if n == "sim.server" or n.startswith("sim.server.")}, (
        f"sim/{path.name} imports sim.server: a service gets what it needs of the sim from its SimRuntime")


def test_no_class_in_the_sim_is_over_400_lines():
    long = []
    for path in sorted(SIM.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            lines, where = node.end_lineno - node.lineno + 1, f"{path.relative_to(SIM.parent)}:{node.name}"
            if lines > MAX_CLASS_LINES and where not in KNOWN_LONG:
                long.append(f"{where} ({lines} lines)")
    assert not long, "split by concern: " + ", ".join(long)


def test_the_check_sees_an_import_of_the_server():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sim.server import SimServer\n"
                     "def f():\n    from sim import server\n")
    assert {"sim.server", "sim.server.SimServer"} <= _imported(tree)
