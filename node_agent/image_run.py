"""A node life whose trainer runs in the job's image (NodeSettings.image): what preparation and the trainer's start
do differently (prepare.py and preparation.py call it; the command line is container.py's, the pull pull.py's).

- The interpreter is the image's: `settings.interpreter` (default `python3`) is looked up inside the image, never on
  the VM. A leading `python`/`python3` of a command is replaced by it as for a bare trainer.
- The checkpoint library needs no change to the image: the respawn wheel (pure Python) is unpacked once per digest
  into `library/HEX/site/` in the node directory, which is mounted into the container and put first on its
  PYTHONPATH; a probe container checks once per image and wheel (library.json) that the image's python imports it
  (its dependencies, NumPy, and google-cloud-storage for a gs:// store, are the image's).
- Setup commands, the previous-life upload and the checkpoint prefetch each run in a container of the image
  (`--rm`) with the same mounts, environment and namespaces as the trainer, cwd the workdir. What setup writes
  outside the mounted paths (the node directory, which holds the workdir) goes with its container: a venv or
  `pip install --target` in the workdir stays, as the environment cache expects.
- Every container is named (container.container_name) and labelled (job, attempt, role); one of the same name left
  by an earlier life is removed first, and a helper stopped early is removed by name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from typing import Callable, Mapping, Sequence

from respawn.contract import StoreUri
from respawn.logs import log

from . import container
from .container import Runtime, RunSpec

SITE = "site"  # library/HEX/site: the unpacked wheel
LIBRARY_PROBE_KEY = "image "  # library.json: "image REF" -> the wheel digest checked importable in that image


class LibraryError(Exception):
    pass


def unpack_wheel(wheel: str, dest: str) -> str:
    """The wheel's files under `dest` (once: kept when there; a wheel is a zip of importable paths). Unsafe names
    (absolute, `..`) are refused."""
    if os.path.isdir(dest):
        return dest
    partial = dest + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if name.startswith("/") or ".." in parts:
                raise LibraryError(f"{wheel} holds an unsafe path {name!r}")
        z.extractall(partial)
    os.replace(partial, dest)
    return dest


class ImageRun:
    """How this node runs things in the job's image: `wrap()` makes any argv a container's command line."""

    def __init__(self, runtime: Runtime, image: str, node_dir: str, *, job_id: str, attempt: int, worker: int,
                 checkpoint_uri: str, accelerator: str | None, base_env: Mapping[str, str]):
        self.runtime, self.image, self.node_dir = runtime, image, node_dir
        self.job_id, self.attempt, self.worker = job_id, attempt, worker
        self.checkpoint_uri, self.accelerator = checkpoint_uri, accelerator
        self.base_env = dict(base_env)  # the agent's own environment: what is not forwarded unless changed

    def name(self, role: str) -> str:
        return container.container_name(self.job_id, self.attempt, self.worker, role)

    def wrap(self, argv: Sequence[str], env: Mapping[str, str], *, role: str, workdir: str | None,
             also: Sequence[str] = ()) -> list[str]:
        """The runtime's command line running `argv` in the image with `env`'s forwarded variables (passed by name:
        the runtime reads their values from its own environment), and the variables named in `also`, which its
        starter adds (the run's marker)."""
        spec = RunSpec(image=self.image, argv=list(argv), name=self.name(role),
                       labels=container.labels(self.job_id, self.attempt, role),
                       env_names=sorted(set(container.forwarded_names(env, self.base_env)) | set(also)),
                       mounts=container.same_path_mounts(self.node_dir, self.checkpoint_uri, workdir),
                       workdir=workdir,  # none: the image's own working directory
                       # setup and the helpers need no accelerator; the trainer gets it
                       accelerator=self.accelerator if role == container.ROLE_TRAINER else None)
        return container.run_argv(self.runtime, spec)

    def prefix(self, env: Mapping[str, str], *, role: str, workdir: str | None) -> list[str]:
        """wrap() without the command: what goes before an interpreter's argv."""
        return self.wrap([], env, role=role, workdir=workdir)

    def clear(self, role: str, env: Mapping[str, str] | None = None) -> bool:
        """Remove this node's container of `role` (one an earlier life or a stopped helper left)."""
        return container.remove(self.runtime, self.name(role), env)

    def record(self) -> dict[str, str]:
        """What trainer.json keeps of the trainer's container: an adopting agent removes it by name after a kill."""
        return {"name": self.name(container.ROLE_TRAINER), "runtime": self.runtime.name, "exe": self.runtime.exe}

    def probe_library(self, python: str, env: Mapping[str, str], workdir: str | None,
                      interrupted: Callable[[], bool]) -> str:
        """Run the image's python on the library once: its version, the imports the trainer needs. Returns the
        version ("3.11"); LibraryError (one line: what the image lacks and what to do) otherwise."""
        gs = StoreUri.parse(self.checkpoint_uri).scheme == StoreUri.GS
        needs = ["respawn.ckpt"] + (["google.cloud.storage"] if gs else [])
        code = ("import importlib, sys\nmissing = []\n"
                f"for m in {needs!r}:\n"
                "    try:\n        importlib.import_module(m)\n"
                "    except Exception as e:\n        missing.append(f'{m} ({type(e).__name__}: {e})')\n"
                "print('respawn-probe', '%d.%d' % sys.version_info[:2], '; '.join(missing))\n")
        argv = self.wrap([python, "-c", code], env, role=container.ROLE_LIBRARY, workdir=workdir)
        try:
            out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=dict(env),
                                 timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.clear(container.ROLE_LIBRARY, env)
            raise LibraryError(f"cannot run {python} in {self.image}: {exc}") from None
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("respawn-probe ")), None)
        if line is None:
            detail = (out.stderr or out.stdout).strip().splitlines()
            raise LibraryError(f"{python} does not run in {self.image} (exit {out.returncode}: "
                               f"{detail[-1] if detail else 'no output'}): set trainer.interpreter to the image's "
                               "Python, e.g. /opt/conda/bin/python")
        _, version, *rest = line.split(" ", 2)
        missing = rest[0].strip() if rest else ""
        if tuple(int(x) for x in version.split(".")) < (3, 10):
            raise LibraryError(f"the image's {python} is Python {version}; Respawn's checkpoint library needs ≥ 3.10: "
                               "set trainer.interpreter to a newer Python in the image")
        if missing:
            raise LibraryError(f"the image's {python} cannot import {missing}: the checkpoint library needs NumPy in "
                               "the image, and google-cloud-storage (>=2.14) for a gs:// checkpoint_uri; add them "
                               "to the image")
        log("INFO", "the image's python imports the checkpoint library", image=self.image, interpreter=python,
            version=version)
        return version


def library_env(site: str, settings_env: Mapping[str, str]) -> str:
    """The container's PYTHONPATH: the unpacked library first, then the job's own PYTHONPATH if it sets one."""
    own = settings_env.get("PYTHONPATH")
    return site + (os.pathsep + own if own else "")

