"""Assemble the source directory `gcloud functions deploy --source` uploads.

The Functions Framework puts only the entry file's own folder on sys.path, and the buildpack wants requirements.txt
and main.py at the source root (docs/gcp-facts.md, Cloud Functions). So the staged source lays the modules out as
their import names say — `respawn/`, `respawn/control/` (from functions/), … per pyproject.toml's package-dir — with
a generated main.py at its root that re-exports the entry points of respawn.control.main; `import respawn.control`
then resolves inside the upload, with no sys.path edits. requirements.txt is the base dependencies plus the
`functions` extra of pyproject.toml, so the deployed function installs exactly what the repository declares.
"""

from __future__ import annotations

import ast
import shutil
import tomllib
from pathlib import Path

from deploy import layout
from respawn import deployment

CONTROL = "respawn.control"  # goes up whole; of the rest of respawn.* only the modules it imports (not the CLI)
# The node startup script (the agent's unit inside it) travels with the control plane, which puts it into node
# metadata. respawn/deployment.py reads the script from there (deployment.startup_script()), so it always goes up too.
FILES = (deployment.STARTUP_SCRIPT,)


class StageError(RuntimeError):
    pass


def _pyproject(root: Path) -> dict:
    try:
        return tomllib.loads((root / "pyproject.toml").read_text())
    except FileNotFoundError:
        raise StageError(f"{root / 'pyproject.toml'} is missing: stage from the root of a Respawn checkout") from None


def package_dirs(root: Path) -> dict[str, Path]:
    """Import package → folder in the checkout (deploy/layout.py)."""
    try:
        dirs = layout.package_dirs(root)
    except layout.LayoutError as exc:
        raise StageError(str(exc)) from None
    if CONTROL not in dirs:
        raise StageError(f"{root / 'pyproject.toml'}: [tool.setuptools.package-dir] does not map {CONTROL}")
    return dirs


def source_file(dirs: dict[str, Path], module: str) -> Path | None:
    """The checkout file of a dotted module name (a module or a package's __init__.py), or None."""
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):  # the longest mapped package prefix wins
        base = dirs.get(".".join(parts[:cut]))
        if base is None:
            continue
        path = base.joinpath(*parts[cut:])
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None
    return None


def requirements(root: Path) -> list[str]:
    project = _pyproject(root)["project"]
    extras = project.get("optional-dependencies", {})
    if "functions" not in extras:
        raise StageError(f"{root / 'pyproject.toml'}: no `functions` extra; it lists what a deployed function needs")
    out: list[str] = []
    for req in [*project.get("dependencies", []), *extras["functions"]]:
        if req not in out:
            out.append(req)
    return out


def _imports(path: Path, package: str) -> set[str]:
    """Every module name a file of `package` imports, at any depth (lazy imports inside functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing file's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def local_modules(root: Path) -> dict[str, Path]:
    """Module name → checkout file, for respawn.control whole and every respawn.* module it reaches."""
    dirs = package_dirs(root)
    control = dirs[CONTROL]
    todo = [(CONTROL + "".join(f".{p}" for p in f.relative_to(control).with_suffix("").parts)).removesuffix(".__init__")
            for f in sorted(control.rglob("*.py")) if "__pycache__" not in f.parts]
    todo.append("respawn")
    seen: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        path = source_file(dirs, module)
        if module in seen or path is None:
            continue
        seen[module] = path
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        todo.extend(_parents(module))  # a module needs its packages' __init__.py
        todo.extend(n for n in _imports(path, package) if n.split(".")[0] == "respawn")
    return seen


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def main_py() -> str:
    names = ", ".join(sorted(f.entry_point for f in deployment.FUNCTIONS))
    return (
        '"""Generated by deploy/stage.py: the deployed source root. Cloud Functions loads the entry points from here;\n'
        'the respawn package sits next to this file, which is on sys.path."""\n\n'
        f"from {CONTROL}.main import {names}  # noqa: F401\n"
    )


def stage(root: Path, out: Path) -> Path:
    """Write the function source under `out` (replacing it) and return it."""
    root, out = Path(root).resolve(), Path(out)
    dirs = package_dirs(root)
    for module in ("respawn", CONTROL, f"{CONTROL}.main", "respawn.deployment"):
        if source_file(dirs, module) is None:
            raise StageError(f"{module} is missing under {root}: the deployed functions need it; restore it and build again")
    for rel in FILES:
        if not (root / rel).is_file():
            raise StageError(f"{root / rel} is missing: the deployed functions need it; restore it and build again")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for module, path in local_modules(root).items():
        dest = out.joinpath(*module.split("."))
        dest = dest / "__init__.py" if path.name == "__init__.py" else dest.with_suffix(".py")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    for rel in FILES:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, out / rel)
    (out / "requirements.txt").write_text("\n".join(requirements(root)) + "\n")
    (out / "main.py").write_text(main_py())
    return out
