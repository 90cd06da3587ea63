"""Build the node agent as one self-contained zipapp: what deploy/vm/startup.sh downloads, checks and runs on the
node image's own python3 (3.9 and up), with nothing installed beside it.

    python -m deploy.agent_zipapp --out DIR     # writes DIR/respawn-agent-<version>.pyz, prints its path and sha256

The archive holds the agent's modules laid out under their import names, as pyproject.toml's package-dir maps
them (respawn/__init__.py, respawn/contract.py, respawn/logs.py, node_agent/*.py as respawn/agent/*.py) and
nothing else: the agent imports only the standard library, respawn.contract and respawn.logs. The bytes depend
only on those files' contents (sorted entries, fixed timestamps and modes, no compression), so a rebuild of the
same checkout has the same sha256, the digest the node checks (respawn.contract.ATTR_AGENT).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tomllib
import zipfile
from pathlib import Path

from deploy import layout

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "respawn.agent"
# The modules of the respawn package the agent imports, besides its own (pyproject.toml's import contract).
SHARED = ("__init__.py", "contract.py", "logs.py")
SHEBANG = b"#!/usr/bin/env python3\n"
# The earliest timestamp a zip can hold; any fixed value makes the archive reproducible.
EPOCH = (1980, 1, 1, 0, 0, 0)

# The archive's entry point. Every module of the agent is imported before it runs, so a running agent never reads
# its archive again: the startup script replaces the file in place on an upgrade (then sends SIGHUP), and
# zipimport re-opens the archive by path for each module it loads, with the old archive's offsets.
MAIN = '''\
"""respawn-agent zipapp: runs the node agent as `python -m respawn.agent` does (deploy/agent_zipapp.py)."""
import importlib
import runpy

for _name in {modules!r}:
    importlib.import_module(_name)
runpy.run_module("respawn.agent", run_name="__main__", alter_sys=True)
'''


class ZipappError(RuntimeError):
    pass


def version(root: Path = ROOT) -> str:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def _folders(root: Path) -> tuple[Path, Path]:
    """The checkout folders pyproject.toml maps to respawn and respawn.agent (respawn/, node_agent/)."""
    try:
        dirs = layout.package_dirs(root)
    except layout.LayoutError as exc:
        raise ZipappError(str(exc)) from None
    if PACKAGE not in dirs:
        raise ZipappError(f"{root / 'pyproject.toml'}: [tool.setuptools.package-dir] maps no {PACKAGE!r}; the zipapp "
                          "follows that mapping, so restore it")
    return dirs["respawn"], dirs[PACKAGE]


def entries(root: Path = ROOT) -> dict[str, bytes]:
    """{archive name: bytes}: the agent's sources under their import names, and the entry point."""
    shared, agent = _folders(root)
    files = {f"respawn/{name}": shared / name for name in SHARED}
    files.update({f"respawn/agent/{p.name}": p for p in sorted(agent.glob("*.py"))})
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing or "respawn/agent/__main__.py" not in files:
        raise ZipappError(f"the agent's sources are incomplete in {root}: missing {missing or ['node_agent/__main__.py']}")
    out = {name: path.read_bytes() for name, path in files.items()}
    modules = sorted(name[:-3].replace("/", ".").removesuffix(".__init__") for name in out
                     if not name.endswith("/__main__.py"))
    out["__main__.py"] = MAIN.format(modules=modules).encode()
    return out


def archive_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    buf.write(SHEBANG)  # zipimport reads the archive from its end, so a prefix is allowed (as zipapp writes it)
    # ZIP_STORED: deflate's output may differ between zlib builds; stored bytes depend on the contents alone.
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.create_system = 3  # Unix, whatever machine builds it
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
            z.writestr(info, files[name])
    return buf.getvalue()


def build(out_dir: Path, root: Path = ROOT) -> Path:
    """Write out_dir/respawn-agent-<version>.pyz (atomically) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"respawn-agent-{version(root)}.pyz"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(archive_bytes(entries(root)))
    tmp.chmod(0o644)
    tmp.replace(path)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.agent_zipapp", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder to write respawn-agent-<version>.pyz into")
    a = ap.parse_args(argv)
    try:
        path = build(Path(a.out))
    except (ZipappError, OSError) as exc:
        print(f"deploy.agent_zipapp: {exc}", file=sys.stderr)
        return 2
    print(f"{path} sha256={sha256(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
