"""The node-side code runs on every supported node image's own `python3`: 3.9 (Debian 11 Deep Learning VM), 3.10
(Ubuntu 22.04, the TPU runtimes), 3.11 and 3.12, with the standard library only.

Three checks, each shown to fail on a planted violation:
- vermin: nothing in node_agent/, respawn/contract.py or respawn/logs.py needs a Python newer than 3.9
  (annotations are not evaluated: every file has `from __future__ import annotations`);
- `X | Y` of types outside annotations (evaluated at run time, 3.10+), which vermin does not look for by default;
- each interpreter found imports every module of respawn.agent from the installed tree with no third-party
  package available, and loads nothing of respawn.* but the agent, respawn.contract and respawn.logs.
The agent's real runs on the older interpreters are in test_agent_process.py (`node_python`).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_fixtures import installed_tree, node_image_python

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "3.9"
NODE_SIDE = [ROOT / "node_agent", ROOT / "respawn" / "contract.py", ROOT / "respawn" / "logs.py"]
AGENT_MODULES = sorted("respawn.agent." + p.stem for p in (ROOT / "node_agent").glob("*.py")
                       if p.stem not in ("__init__", "__main__"))
ALLOWED = {"respawn", "respawn.contract", "respawn.logs", "respawn.agent", *AGENT_MODULES}


def _node_side_files(paths: list[Path]) -> list[Path]:
    return sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")) if "__pycache__" not in f.parts)


# ------------------------------------------------------------------------------------------------- vermin

def _vermin(paths: list[Path]) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("vermin")
    exe_s = str(exe) if exe.exists() else shutil.which("vermin")
    if not exe_s:
        pytest.fail("vermin is not installed: pip install -e '.[dev]'", pytrace=False)
    return subprocess.run(
        [exe_s, "--no-config-file", f"--target={FLOOR}-", "--violations", "--no-tips", "--no-eval-annotations",
         "--processes=1", *map(str, paths)],
        capture_output=True, text=True, timeout=300,
    )


def test_node_side_code_needs_nothing_newer_than_3_9(tmp_path):
    kept = _vermin(NODE_SIDE)
    assert kept.returncode == 0, f"node-side code needs a Python newer than {FLOOR}:\n{kept.stdout}{kept.stderr}"

    planted = tmp_path / "planted.py"
    planted.write_text(textwrap.dedent("""\
        from __future__ import annotations
        import subprocess

        def start(argv: list[str]) -> subprocess.Popen | None:
            try:
                return subprocess.Popen(argv, process_group=0)
            except* OSError:
                return None
        """))
    broken = _vermin([*NODE_SIDE, planted])
    assert broken.returncode != 0
    assert "planted.py" in broken.stdout and "process_group" in broken.stdout, broken.stdout
    assert "node_agent" not in broken.stdout  # only the planted file is named


# ------------------------------------------------------------------------------- X | Y evaluated at run time

_TYPE_NAMES = {"None", "int", "float", "str", "bytes", "bool", "dict", "list", "tuple", "set", "frozenset", "type",
               "object", "Any"}


def _is_type_like(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Name) and node.id in _TYPE_NAMES:
        return True
    if isinstance(node, ast.Subscript):  # dict[str, int], Optional[X], ...
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (
        _is_type_like(node.left) or _is_type_like(node.right))


def runtime_type_unions(path: Path) -> list[str]:
    """`X | Y` of types outside annotations (isinstance(v, int | None), a type alias, a TypedDict's functional
    form, ...): evaluated when the line runs, so Python 3.10+. Annotations are skipped (they are not evaluated
    under `from __future__ import annotations`). A heuristic: an operand must look like a type."""
    tree = ast.parse(path.read_text(), str(path))
    annotations: set[int] = set()
    for node in ast.walk(tree):
        for ann in ([node.annotation] if isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation else []) + \
                   ([node.returns] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns
                    else []):
            annotations.update(id(n) for n in ast.walk(ann))
    return [f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in annotations
            and _is_type_like(node)]


def test_no_type_union_is_evaluated_at_run_time(tmp_path):
    found = [hit for f in _node_side_files(NODE_SIDE) for hit in runtime_type_unions(f)]
    assert not found, f"`X | Y` of types evaluated at run time needs Python 3.10+: {found}"

    planted = tmp_path / "pkg" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("from __future__ import annotations\n"
                       "def f(v: int | None, flags: int) -> str | None:\n"
                       "    both = flags | 4\n"
                       "    return 'x' if isinstance(v, int | None) else None\n")
    assert runtime_type_unions(planted) == ["pkg/planted.py:4: int | None"]


# -------------------------------------------------------------------- each node Python, standard library only

_IMPORT_ALL = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m == "respawn" or m.startswith("respawn."))))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return installed_tree(tmp_path_factory.mktemp("installed") / "site")


def _import_all(exe: str, site: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([exe, *flags, "-c", _IMPORT_ALL, *AGENT_MODULES], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("version", ["3.9", "3.10", "current", "3.12"])
def test_each_node_python_imports_the_agent_with_the_standard_library_only(version, tree, tmp_path):
    if version == "current":
        # -S: no site-packages, so none of this environment's third-party packages (pydantic, NumPy, google.*).
        exe, flags = sys.executable, ("-S",)
    else:
        exe, flags = node_image_python(version), ("-s",)
    out = _import_all(exe, tree, tmp_path, *flags)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert loaded >= set(AGENT_MODULES) and loaded <= ALLOWED, sorted(loaded - ALLOWED)


def test_an_agent_import_of_the_schema_fails_on_a_bare_python(tmp_path):
    """The check above fails on a violation: respawn.schema (pydantic) imported by one agent module."""
    site = installed_tree(tmp_path / "site")
    heartbeat = site / "respawn" / "agent" / "heartbeat.py"
    planted = "from respawn.logs import log\nfrom respawn.schema import NODES  # planted\n"
    heartbeat.write_text(heartbeat.read_text().replace("from respawn.logs import log\n", planted))
    out = _import_all(sys.executable, site, tmp_path, "-S")
    assert out.returncode != 0 and "No module named 'pydantic'" in out.stderr, out.stderr
