"""What a sim node boots as its image: the real deploy/vm/startup.sh, fetching the agent zipapp the way a VM does.

    agent = publish_agent(out_dir, storage)        # built by deploy/agent_zipapp.py, uploaded → URI#sha256=HEX
    command, env = boot(python)                    # SimServer(boot_command=command, node_env=env)
    library = publish_library(out_dir, storage)    # the respawn wheel, as the build makes it → URI#sha256=HEX

The control plane puts `agent` into each node's `respawn-agent` attribute (RESPAWN_AGENT in the functions'
environment), and `library` into `respawn-library` (RESPAWN_LIBRARY) where a trainer runs in an image, whose
python gets the library from the node (a bare trainer uses the node image's python, which has it). On boot the startup script checks the interpreter, downloads and verifies the zipapp (through the
storage emulator's JSON API with the metadata server's token, as on a VM), writes the unit and hands it to
sim/node_systemctl.py, which becomes the agent. What lives on a VM's disk — /opt/respawn and the unit folder — lives
in the node's directory, so that a restart in place finds it again and a replacement starts bare.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from deploy import agent_zipapp
from respawn import deployment
from sim import node_systemctl

REPO = Path(__file__).resolve().parents[1]
STARTUP = REPO / "deploy" / "vm" / "startup.sh"
AGENT_NAME = "respawn-agent.pyz"
PACKAGE_DIRS = ("respawn", "functions", "node_agent", "trainer")  # pyproject.toml's package-dir


@dataclass(frozen=True)
class Storage:
    """A Cloud Storage JSON API endpoint (the storage emulator's url) and a bucket on it."""

    url: str
    bucket: str


def upload(storage: Storage, name: str, data: bytes) -> str:
    """Put `data` at gs://BUCKET/NAME on the emulator; returns that URI."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = storage.url  # the client reads it when it is made
    try:
        client = gcs.Client(project="respawn-sim", credentials=AnonymousCredentials())
        client.bucket(storage.bucket).blob(name).upload_from_string(data)
    finally:
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous
    return f"gs://{storage.bucket}/{name}"


def publish_agent(out_dir: Path, storage: Storage | None = None, release: str = "sim") -> str:
    """Build the agent zipapp into out_dir and publish it as the build does; returns the `respawn-agent` value.
    Without storage the node copies it from file:///…, with storage it downloads gs://BUCKET/respawn/releases/…"""
    path = agent_zipapp.build(out_dir)
    digest = agent_zipapp.sha256(path)
    if storage is None:
        return f"{path.resolve().as_uri()}#sha256={digest}"
    uri = deployment.release_artifact(storage.bucket, release, AGENT_NAME, digest)
    upload(storage, uri.split("#")[0].removeprefix(f"gs://{storage.bucket}/"), path.read_bytes())
    return uri


def publish_library(out_dir: Path, storage: Storage, release: str = "sim") -> str:
    """Build the respawn wheel into out_dir with the build's own command (cloudbuild.yaml) and publish it as the
    build does; returns the `respawn-library` value. Built from a copy of the sources: setuptools builds in the
    tree (build/), where two demos at once would collide."""
    src, wheels = Path(out_dir) / "wheel-src", Path(out_dir) / "wheel"
    src.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        if entry.is_file() and not entry.name.startswith("."):  # pyproject.toml, the README it names
            shutil.copy2(entry, src / entry.name)
    for package in PACKAGE_DIRS:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
                          "--no-build-isolation", f"--wheel-dir={wheels}", str(src)],
                         capture_output=True, text=True, timeout=300)
    shutil.rmtree(src, ignore_errors=True)
    found = sorted(wheels.glob("respawn-*.whl"))
    if out.returncode != 0 or not found:
        raise RuntimeError(f"pip wheel of {REPO} failed (exit {out.returncode}): "
                           f"{(out.stderr or out.stdout).strip()[-500:]}")
    data = found[-1].read_bytes()
    uri = deployment.release_artifact(storage.bucket, release, found[-1].name, hashlib.sha256(data).hexdigest())
    upload(storage, uri.split("#")[0].removeprefix(f"gs://{storage.bucket}/"), data)
    return uri


def boot(python: str, storage: Storage | None = None) -> tuple[list[str], dict[str, str]]:
    """The boot command and node environment of a sim node whose image has `python` as its python3."""
    env = {
        "PYTHON": python,
        "RESPAWN_ROOT": "{node_dir}/opt/respawn",
        "SYSTEMD_UNIT_DIR": "{node_dir}/etc/systemd/system",
        "SYSTEMCTL": node_systemctl.command(),
    }
    if storage is not None:
        env["RESPAWN_STORAGE_HOST"] = storage.url
    return ["bash", str(STARTUP)], env
