"""The Debian packages some tests drive for real (debootstrap builds a node image, Chromium renders the report page,
systemd-analyze checks the node units, Java runs the emulators), installed once per test session when missing, so
that the README's test command alone prepares a fresh Debian machine. Needs root and apt-get; otherwise nothing is
installed and the tests that need a package fail with its install hint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# package: the programs that show it is installed (any one)
NEEDED = {
    "debootstrap": ("debootstrap", "/usr/sbin/debootstrap"),
    "chromium": ("chromium", "chromium-browser"),
    "systemd": ("systemd-analyze",),
    "default-jre-headless": ("java",),
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
