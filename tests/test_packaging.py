"""What `pip install respawn` gets: only the respawn.* namespace, usable on its own, and the import rules of
pyproject.toml (checked by .ci/lint-imports, which CI runs) actually failing on a violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from deploy import layout

ROOT = Path(__file__).resolve().parent.parent
WHEEL_PARTS = layout.wheel_sources(ROOT)
NOT_INSTALLED = ("functions", "node_agent", "trainer", "sim", "bench", "deploy", "tests")


def _copy_source(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for part in WHEEL_PARTS:
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy2)(
            ROOT / part, dest / part, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / part).is_dir() else {}))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    src = _copy_source(base / "src")
    # With this environment's setuptools (pyproject.toml's build requirement), not an isolated one installed for the
    # build: the same files, a third of the CPU. .ci/lint-imports, run by the contracts' test, builds isolated.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(base / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (found,) = (base / "dist").glob("respawn-*.whl")
    return found


def _expected_files() -> set[str]:
    """Every module of the installable folders, under its import path (pyproject.toml package-dir)."""
    return {"/".join(name.split(".")) + ("/__init__.py" if path.name == "__init__.py" else ".py")
            for name, path in layout.module_files(layout.package_dirs(ROOT)).items()}


def test_the_wheel_holds_the_respawn_namespace_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not n.startswith(("respawn/", "respawn-"))]
    assert not outside, f"the wheel ships files outside respawn/: {outside}"
    assert {n for n in names if n.endswith(".py")} == _expected_files()
    # The local stand-ins and benchmarks stay in the checkout.
    assert not [n for n in names if n.split("/")[1:2] in (["sim"], ["bench"])]


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed (offline, without its dependencies), and this
    environment's third-party packages visible through a .pth file — but not its editable respawn."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    # Without a pip of its own (ensurepip is most of a venv's cost): this environment's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_installed_wheel_imports_the_library_and_no_top_level_strays(fresh_venv, tmp_path):
    code = ("import importlib.util, respawn.ckpt, respawn.contract, respawn.agent.agent, respawn.control.main\n"
            "assert respawn.ckpt.__file__.endswith('site-packages/respawn/ckpt/__init__.py'), respawn.ckpt.__file__\n"
            f"print([n for n in {NOT_INSTALLED!r} if importlib.util.find_spec(n)])\n")
    p = _run(str(fresh_venv / "bin" / "python"), "-I", "-c", code, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", f"importable outside a checkout: {p.stdout}"


def test_respawn_demo_from_a_wheel_says_how_to_get_it(fresh_venv, tmp_path):
    p = _run(str(fresh_venv / "bin" / "respawn"), "demo", cwd=tmp_path)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "source checkout" in p.stderr and "pip install -e '.[dev]'" in p.stderr


# ------------------------------------------------------------------------------------------- import contracts

LINT = ROOT / ".ci" / "lint-imports"
VENV_BIN = {"VENV_BIN": str(Path(sys.executable).parent)}


def _lint(source: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LINT), str(source)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **VENV_BIN})


def _installed_layout(dest: Path) -> dict[Path, Path]:
    """Every module copied to its import path under `dest`, as the wheel lays it out (the wheel's files are exactly
    these: test_the_wheel_holds_the_respawn_namespace_and_nothing_else); its checkout file → its copy."""
    copies = {}
    for name, path in layout.module_files(layout.package_dirs(ROOT)).items():
        copy = dest / Path(*name.split(".")) / "__init__.py" if path.name == "__init__.py" else (
            dest / Path(*name.split(".")).with_suffix(".py"))
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
        copies[path] = copy
    return copies


def test_the_import_contracts_hold_and_a_violation_fails_them(tmp_path):
    # The checkout as CI checks it (.ci/lint-imports builds the wheel and lints what it installs).
    kept = _lint(ROOT)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "0 broken" in kept.stdout

    # The violations are planted in the installed layout itself and linted there with the same contracts (no second
    # wheel build: the layout is the wheel's, file for file).
    copies = _installed_layout(tmp_path / "violating")
    plant = {
        "functions/observation.py": "from respawn.control.adapters import compute  # planted\n",
        "node_agent/heartbeat.py": "import numpy  # planted\n",
        "respawn/app/cli.py": "import sim.core  # planted\n",
        "respawn/schema.py": "from google.cloud import firestore  # planted\n",
    }
    for rel, line in plant.items():
        path = copies[ROOT / rel]
        text = path.read_text()
        cut = text.index("\nfrom __future__ import annotations\n") + len("\nfrom __future__ import annotations\n")
        path.write_text(text[:cut] + line + text[cut:])
    broken = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--config", str(ROOT / "pyproject.toml"),
                             "--no-cache"], cwd=tmp_path / "violating", capture_output=True, text=True, timeout=300)
    assert broken.returncode != 0
    for contract in ("the pure control core imports no Google client and no adapter",
                     "the node agent imports only the standard library, the contract and logs",
                     "nothing installable imports the local stand-ins or the benchmarks",
                     "google.* is imported only by the adapters and the checkpoint storage module",
                     # observation -> adapters.compute -> settings -> observation: the planted import closes a cycle too
                     "no import cycle between the modules and subpackages of any package"):
        assert f"{contract} BROKEN" in broken.stdout, broken.stdout
    assert "5 broken" in broken.stdout
