"""The trainer's OCI image for the tests (issue #47): sim/trainer_image.py's image (a Debian 12 root, Debian's
Python 3.11, torch 2.13.0 CPU and numpy copied from this interpreter, the demo's example trainer in /opt/trainer),
built once into the ignored .cache/trainer-images/ and pushed to the session's registry (tests/registry_fixtures.py).

The build (a few minutes the first time: debootstrap, then packing about 0.6 GB) starts in the background as soon as
the session has collected a test that uses the image (start_building); the fixture then waits on the build's lock.
Building needs root, debootstrap and the Debian mirror; a missing one fails the test with the hint, never a skip.

node_podman(node_dir, registry_host): podman as a sim node runs it (sim/node_containers.py: runc, cgroupfs, the
storage on the node's disk, the registry over plain http), for tests that pull and run the image without an agent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import system_packages
from sim import trainer_image
from sim.node_containers import NodeContainers

PODMAN_HINT = "apt-get install podman runc (tests/system_packages.py installs them as root)"
_capture = None  # pytest's capture manager: progress lines go around it


def _say(line: str) -> None:
    with _capture.global_and_fixture_disabled() if _capture is not None else contextlib.nullcontext():
        print(f"\n[trainer image] {line}", file=sys.stderr, flush=True)


def start_building(config) -> subprocess.Popen | None:
    """sim.trainer_image's build in a process of its own, started once the session has collected a test that uses
    the image; None when it is cached or cannot be built here (the test then says why)."""
    if os.geteuid() != 0 or trainer_image.cached() is not None:
        return None
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # its progress lines reach the terminal
        return subprocess.Popen([sys.executable, "-m", "sim.trainer_image"], cwd=trainer_image.REPO,
                                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def trainer_image_built(pytestconfig) -> trainer_image.Image:
    global _capture
    _capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    system_packages.wait_installed()
    try:
        return trainer_image.build(_say)
    except trainer_image.ImageError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def trainer_image_ref(trainer_image_built, registry) -> str:
    """The image pushed to the session's registry: `127.0.0.1:PORT/team/trainer:v1@sha256:…`."""
    started = time.monotonic()
    try:
        ref = trainer_image.push(trainer_image_built, registry.host, say=_say)
    except trainer_image.ImageError as exc:
        pytest.fail(str(exc), pytrace=False)
    _say(f"pushed {trainer_image_built.size / 1e6:.0f} MB to {registry.host} in {time.monotonic() - started:.1f} s")
    return ref


def podman_binary() -> str:
    system_packages.wait_installed()
    podman = shutil.which("podman")
    if podman is None or shutil.which("runc") is None and not os.path.exists("/usr/sbin/runc"):
        pytest.fail(f"podman with runc runs the trainer's image: {PODMAN_HINT}", pytrace=False)
    return podman


def node_podman(node_dir: Path, registry_host: str):
    """A function running `podman ARGS…` with a sim node's configuration (its storage under node_dir) that returns
    the CompletedProcess (text, output captured)."""
    env = {**os.environ, **NodeContainers(registries=(registry_host,)).prepare(node_dir)}
    podman = podman_binary()

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([podman, *args], env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    return run
