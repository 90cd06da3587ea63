"""Shared test harness: the official Firestore and Pub/Sub emulators, started once per test session (per xdist
worker, on free ports) only when a test asks for them, and stopped with their whole process group at the end.

A missing emulator fails the run with an install hint; it is never a silent skip. What takes minutes of network on a
fresh machine starts in the background at the session's start: the Debian packages the tests drive, and the node
image's build once a test that boots it is collected.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

import node_image_fixtures
import trainer_image_fixtures
import system_packages
from registry_fixtures import registry  # noqa: F401  (a session fixture every module may ask for)
from sim import emulators

PROJECT = "respawn-test"


# Every JAX process the suite starts (trainers, demos' nodes, benchmarks) compiles the same few small programs; a
# persistent compilation cache shared by the session makes that once: about 4 s of CPU less for each process after
# the first (JAX's own feature; an executable read from it is the one a compile makes). Eviction on: the cache then
# takes a file lock around every read and write, so no process reads an entry another is still writing.
JAX_CACHE = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30)}


def pytest_sessionstart(session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, once, before xdist's workers start
        # The session's folder: the background install's end marker, the JAX cache (the workers, and what they
        # start, inherit the environment set here).
        session.config.scratch = tempfile.mkdtemp(prefix="respawn-tests-")
        session.config.installing = system_packages.start_installing(Path(session.config.scratch) / "packages-done")
        if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
            os.environ.update(JAX_CACHE, JAX_COMPILATION_CACHE_DIR=os.path.join(session.config.scratch, "jax-cache"))


def pytest_collection_finish(session) -> None:
    # One process of the session (xdist's first worker: every worker collects the same tests) starts the node
    # image's build if a test will need it.
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0" and not session.config.option.collectonly and any(
            "bullseye_image" in getattr(item, "fixturenames", ()) for item in session.items):
        session.config.building = node_image_fixtures.start_building(session.config)
    # Likewise the trainer's OCI image (issue #47), for the tests that pull it and the container demo scenarios.
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0" and not session.config.option.collectonly and any(
            "trainer_image_built" in getattr(item, "fixturenames", ()) or "container" in item.nodeid
            for item in session.items):
        session.config.building_trainer_image = trainer_image_fixtures.start_building(session.config)


def pytest_sessionfinish(session) -> None:
    for name in ("building", "building_trainer_image"):
        building = getattr(session.config, name, None)
        if building is not None and building.poll() is None:  # the run stopped before the test that needs it
            emulators.stop_groups([building])
    if getattr(session.config, "scratch", None):
        if session.config.installing is not None:
            session.config.installing.wait()
        shutil.rmtree(session.config.scratch, ignore_errors=True)


def _start(kind: str):
    start = {"firestore": emulators.start_firestore, "pubsub": emulators.start_pubsub}[kind]
    system_packages.wait_installed()  # Java
    try:
        return start()
    except emulators.EmulatorError as exc:
        pytest.fail(f"cannot start the {kind} emulator: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def project() -> str:
    return PROJECT


@pytest.fixture(scope="session")
def firestore_emulator():
    """The Firestore emulator's host:port; FIRESTORE_EMULATOR_HOST points at it for the whole session."""
    emu = _start("firestore")
    previous = os.environ.get("FIRESTORE_EMULATOR_HOST")
    os.environ["FIRESTORE_EMULATOR_HOST"] = emu.host
    yield emu.host
    emu.stop()
    if previous is None:
        os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
    else:
        os.environ["FIRESTORE_EMULATOR_HOST"] = previous


@pytest.fixture(scope="session")
def pubsub_emulator():
    """The Pub/Sub emulator's host:port; PUBSUB_EMULATOR_HOST points at it for the whole session."""
    emu = _start("pubsub")
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = emu.host
    yield emu.host
    emu.stop()
    if previous is None:
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = previous


@pytest.fixture
def firestore_db(firestore_emulator, project):
    """A Firestore client on an emptied emulator database."""
    from google.cloud import firestore

    emulators.reset_firestore(firestore_emulator, project)
    client = firestore.Client(project=project)
    yield client
    client.close()


@pytest.fixture
def nodes_db(firestore_db, project):
    """The heartbeats' database (respawn.contract.NODES_DATABASE), emptied with firestore_db."""
    from google.cloud import firestore

    from respawn.contract import NODES_DATABASE

    client = firestore.Client(project=project, database=NODES_DATABASE)
    yield client
    client.close()
