"""Reusable fixtures and helpers for tests that drive sim/ through the real Google client libraries.

Import what you need in your test module:

    from sim_fixtures import sim_server, compute_clients, tpu_client, compute_result  # noqa: F401

Fixtures:
- `sim_server`: a started SimServer for project "respawn-test" with fast timings (notice 1 s, op_delay 0.02 s),
  no boot command; stopped (with every node process) after the test.
- `sim_factory`: call it with SimServer keyword arguments to get more started servers (all stopped afterwards).
"""

from __future__ import annotations

import functools

import pytest
from google.api_core.future import polling
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials

from respawn.control.adapters.compute import ComputeOperation
from sim.server import SimServer

PROJECT = "respawn-test"
FAST = {"notice_seconds": 1.0, "op_delay": 0.02}


def compute_clients(endpoint: str):
    """(InstancesClient, ZoneOperationsClient) on the sim, REST transport, anonymous credentials."""
    from google.cloud import compute_v1

    opts = ClientOptions(api_endpoint=endpoint)
    kwargs = dict(credentials=AnonymousCredentials(), transport="rest", client_options=opts)
    return compute_v1.InstancesClient(**kwargs), compute_v1.ZoneOperationsClient(**kwargs)


def tpu_client(endpoint: str):
    from google.cloud import tpu_v2

    return tpu_v2.TpuClient(credentials=AnonymousCredentials(), transport="rest",
                            client_options=ClientOptions(api_endpoint=endpoint))


def compute_operation(ops_client, project: str, zone: str, op) -> ComputeOperation:
    """Wrap the Operation returned by a `*_unary` call so that `.result()` polls through `ops_client` (built on
    the sim's endpoint) and raises what the real `.result()` raises (ServiceUnavailable, Forbidden, ...)."""
    from google.cloud import compute_v1

    request = compute_v1.GetZoneOperationRequest(project=project, zone=zone, operation=op.name)
    return ComputeOperation.make(functools.partial(ops_client.get, request), lambda: None, op)


# Poll the sim quickly (the library's default starts at 1 s between polls).
FAST_POLLING = polling.DEFAULT_POLLING.with_delay(initial=0.02, maximum=0.2, multiplier=1.5)


def compute_result(ops_client, project: str, zone: str, op, timeout: float = 30):
    return compute_operation(ops_client, project, zone, op).result(timeout=timeout, polling=FAST_POLLING)


@pytest.fixture
def sim_factory(tmp_path):
    started: list[SimServer] = []

    def make(**kwargs) -> SimServer:
        options = {"project": PROJECT, **FAST, "nodes_root": tmp_path / f"nodes{len(started)}", **kwargs}
        sim = SimServer(options.pop("project"), **options)
        sim.start()
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.stop()


@pytest.fixture
def sim_server(sim_factory) -> SimServer:
    return sim_factory()
