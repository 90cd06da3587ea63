"""Shared test harness: the official Firestore and Pub/Sub emulators, started once per test session (per xdist
worker, on free ports) only when a test asks for them, and stopped with their whole process group at the end.

A missing emulator fails the run with an install hint; it is never a silent skip.
"""

from __future__ import annotations

import os

import pytest

import system_packages
from sim import emulators

PROJECT = "respawn-test"


def pytest_sessionstart(session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, once, before xdist's workers start
        system_packages.install_missing()


# Modules whose tests each run whole jobs (demos, framework integrations, benchmarks at CI size, built images) for a
# minute or more. Each worker starts with its share of them, whole modules (their module-scoped fixtures built once):
# xdist's worksteal gives each worker a contiguous slice of the collection and an idle worker steals from the end of
# another's, so the suite ends on quick tests instead of one worker running a long one alone while the other idles.
LONG_RUNNING = {
    "test_demo_scenarios", "test_integration_transformers", "test_integration_accelerate", "test_integration_lightning",
    "test_integration_orbax", "test_bench_recovery", "test_bench_boot", "test_trainer_exit", "test_node_image_debian",
    "test_deploy_build", "test_trainer_sharded",
}


def pytest_collection_modifyitems(config, items) -> None:
    workers = getattr(config.option, "numprocesses", None)
    if not isinstance(workers, int) or workers < 2:
        return
    modules: dict[str, list] = {}
    for item in items:
        if item.module.__name__ in LONG_RUNNING:
            modules.setdefault(item.module.__name__, []).append(item)
    short = [item for item in items if item.module.__name__ not in LONG_RUNNING]
    ordered = []
    for w in range(workers):  # slice w: its long modules first, then short tests up to the slice's size
        size = len(items) // workers + (len(items) % workers if w == workers - 1 else 0)
        mine = [item for tests in list(modules.values())[w::workers] for item in tests]
        take = max(size - len(mine), 0)
        ordered += mine + short[:take]
        short = short[take:]
    items[:] = ordered + short


def _start(kind: str):
    start = {"firestore": emulators.start_firestore, "pubsub": emulators.start_pubsub}[kind]
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
