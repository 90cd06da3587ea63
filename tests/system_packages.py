"""The Debian packages some tests drive for real (debootstrap builds a node image, Chromium renders the report page,
podman runs a trainer image from a local registry, systemd-analyze checks the node units, Java runs the emulators),
installed once per test session when missing, so that the README's test command alone prepares a fresh Debian machine. Needs root and apt-get; otherwise nothing is
installed and the tests that need a package fail with its install hint.

The install runs in the background (start_installing, from the session's controller) while the tests that need no
package run; one that needs a package calls wait_installed() first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DONE = "RESPAWN_TESTS_PACKAGES_DONE"  # the file the background install writes when it has finished, success or not

# package: the programs that show it is installed (any one)
NEEDED = {
    "debootstrap": ("debootstrap", "/usr/sbin/debootstrap"),
    "chromium": ("chromium", "chromium-browser"),
    "systemd": ("systemd-analyze",),
    "default-jre-headless": ("java",),
    # The trainer in a user's image (issue #47): podman with runc (crun fails on this kind of machine, see
    # local-testing.md), and Debian's registry standing in for Artifact Registry.
    "podman": ("podman",),
    "runc": ("runc", "/usr/sbin/runc"),
    "docker-registry": ("docker-registry", "/usr/bin/docker-registry"),
}


def missing() -> list[str]:
    def present(program: str) -> bool:
        return os.path.isabs(program) and os.access(program, os.X_OK) or shutil.which(program) is not None

    return [pkg for pkg, programs in NEEDED.items() if not any(present(p) for p in programs)]


def install_missing() -> None:
    """apt-get install what is missing (after one apt-get update if the first try fails), one line of progress."""
    wanted = missing()
    if not wanted or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    print(f"tests: installing Debian packages the tests use: {' '.join(wanted)} (apt-get, once)", file=sys.stderr,
          flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", *wanted]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = subprocess.run(install, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(f"tests: apt-get could not install {' '.join(wanted)}: {done.stderr.strip()[-300:]}",
                  file=sys.stderr, flush=True)


def start_installing(done: Path) -> subprocess.Popen | None:
    """install_missing() in a process of its own; `done` is written when it ends, and the tests (this process's
    children, xdist's workers among them) find its path in the environment. None when nothing is to be installed."""
    if not missing() or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None
    os.environ[DONE] = str(done)
    return subprocess.Popen([sys.executable, __file__, str(done)], start_new_session=True)


def wait_installed(timeout: float = 900) -> None:
    """Return once the session's background install (if any) has ended."""
    done = os.environ.get(DONE)
    deadline = time.monotonic() + timeout
    while done and not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.5)


if __name__ == "__main__":
    try:
        install_missing()
    finally:
        Path(sys.argv[1]).touch()
