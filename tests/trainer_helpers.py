"""Helpers for the trainer tests: a real GCS emulator (gcp-storage-emulator) on 127.0.0.1 and a free port, run
as a subprocess in its own process group and stopped by that group at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sim.emulators import free_port  # noqa: F401 - the one way a test picks a port for a server it starts

BUCKET = "respawn-test"


def _emulator_cmd(port: int) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    if not os.path.exists(exe):
        pytest.fail("gcp-storage-emulator is not installed in this venv: pip install -e '.[dev]' "
                    "(or pip install gcp-storage-emulator)", pytrace=False)
    return [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--default-bucket", BUCKET,
            "--in-memory", "--quiet"]


@pytest.fixture(scope="module")
def gcs_emulator(tmp_path_factory):
    """STORAGE_EMULATOR_HOST value of a running emulator with bucket BUCKET."""
    port = free_port()
    log = tmp_path_factory.mktemp("gcs") / "emulator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(_emulator_cmd(port), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    host = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gcp-storage-emulator exited with {proc.returncode} at start; see {log}: "
                            f"{log.read_text()[-2000:]}", pytrace=False)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"gcp-storage-emulator did not listen on 127.0.0.1:{port} within 30 s; see {log}",
                                pytrace=False)
                time.sleep(0.1)
        yield host
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    """Points google-cloud-storage at the emulator for one test; yields a client."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    client = storage.Client(project="respawn-test", credentials=AnonymousCredentials())
    yield client


@pytest.fixture
def small_ranges(monkeypatch):
    """Ranges of 64 KiB read in 16 KiB chunks: a 256 KiB data file is four ranged GETs of four chunks each."""
    from respawn.ckpt import format as fmt

    monkeypatch.setattr(fmt, "RANGE_BYTES", 64 << 10)
    monkeypatch.setattr(fmt, "READ_CHUNK", 16 << 10)


def ranged_state(seed: int) -> dict:
    """A state of several dtypes that spans several ranges at small_ranges' sizes."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300_000, generator=g), "h": torch.randn(7, 9, generator=g).to(torch.bfloat16),
            "n": np.random.default_rng(seed).integers(0, 1 << 30, 20_000), "empty": torch.zeros(0, 3), "seed": seed}
