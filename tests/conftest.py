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
