"""Which checkout folder is which import package: pyproject.toml's [tool.setuptools.package-dir] (functions/ is
respawn.control, node_agent/ respawn.agent, trainer/ respawn.ckpt), read here alone for every tool that lays the
tree out by import name. `python -m deploy.layout [CHECKOUT]` prints what the wheel is built from, one a line, for
the shell's tools."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class LayoutError(RuntimeError):
    pass


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Import package → its folder in the checkout, the top package first."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except FileNotFoundError:
        raise LayoutError(f"{root / 'pyproject.toml'} is missing: run from the root of a Respawn checkout") from None
    mapping = data.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if "respawn" not in mapping:
        raise LayoutError(f"{root / 'pyproject.toml'}: [tool.setuptools.package-dir] does not map respawn; restore it")
    return {name: root / folder for name, folder in sorted(mapping.items())}


def module_files(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module's import name → its file (a package is its __init__.py), for the packages `dirs` maps."""
    modules: dict[str, Path] = {}
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules.setdefault(name, path)  # respawn/ holds no control/ of its own: functions/ is respawn.control
    return modules


def wheel_sources(root: Path = ROOT) -> list[str]:
    """What the wheel is built from, relative to the checkout: the project's files and the packages' folders."""
    return ["pyproject.toml", "README.md", *(str(f.relative_to(root)) for f in package_dirs(root).values())]


if __name__ == "__main__":
    print("\n".join(wheel_sources(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)))
