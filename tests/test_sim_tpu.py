"""sim/'s Cloud TPU v2 subset, driven only through the real google-cloud-tpu client (REST transport)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from sim_fixtures import PROJECT, sim_factory, sim_server, tpu_client  # noqa: F401

ZONE = "europe-west4-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
V5E = "v5litepod-8"


def spot_node(job: str = "job-t") -> tpu_v2.Node:
    return tpu_v2.Node(
        accelerator_type=V5E, runtime_version="v2-alpha-tpuv5-lite",
        scheduling_config=tpu_v2.SchedulingConfig(spot=True),
        labels={"respawn-job": job}, metadata={"respawn-job": job, "respawn-attempt": "1"},
    )


def create(client, node_id: str, node=None):
    return client.create_node(parent=PARENT, node_id=node_id, node=node or spot_node()).result(timeout=30)


def test_create_goes_creating_then_ready(sim_server):
    client = tpu_client(sim_server.endpoint)
    op = client.create_node(parent=PARENT, node_id="job-t-1", node=spot_node())
    assert not op.operation.done  # the create answer itself is not finished
    node = op.result(timeout=30)
    assert node.name == f"{PARENT}/nodes/job-t-1"
    assert node.state == tpu_v2.Node.State.READY
    got = client.get_node(name=f"{PARENT}/nodes/job-t-1")
    assert got.accelerator_type == V5E
    assert got.scheduling_config.spot
    assert got.labels["respawn-job"] == "job-t"
    assert got.metadata["respawn-attempt"] == "1"
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [f"{PARENT}/nodes/job-t-1"]
    assert [s for _, s in sim_server.history()[0]["states"]] == ["CREATING", "READY"]


def test_delete_and_not_found(sim_server):
    client = tpu_client(sim_server.endpoint)
    create(client, "job-t-1")
    client.delete_node(name=f"{PARENT}/nodes/job-t-1").result(timeout=30)
    assert [s for _, s in sim_server.history()[0]["states"]] == ["CREATING", "READY", "DELETING", "DELETED"]
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/job-t-1")
    with pytest.raises(exceptions.NotFound):
        client.delete_node(name=f"{PARENT}/nodes/job-t-1")


def test_duplicate_create_is_already_exists(sim_server):
    client = tpu_client(sim_server.endpoint)
    create(client, "job-t-1")
    with pytest.raises(exceptions.Conflict):
        client.create_node(parent=PARENT, node_id="job-t-1", node=spot_node())


def test_stockout_raises_resource_exhausted_from_result(sim_server):
    sim_server.set_capacity(ZONE, V5E, 0)
    client = tpu_client(sim_server.endpoint)
    op = client.create_node(parent=PARENT, node_id="job-t-1", node=spot_node())
    with pytest.raises(exceptions.ResourceExhausted) as info:
        op.result(timeout=30)
    assert f'There is no more capacity in the zone "{ZONE}"' in info.value.message
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/job-t-1")


def test_preempted_node_keeps_holding_quota_until_deleted(sim_server):
    sim_server.set_quota("europe-west4", V5E, 1)
    client = tpu_client(sim_server.endpoint)
    create(client, "job-t-1")
    sim_server.preempt(ZONE, "job-t-1")
    sim_server.wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/job-t-1").state == tpu_v2.Node.State.PREEMPTED,
                        what="TPU node PREEMPTED")
    with pytest.raises(exceptions.ResourceExhausted) as info:
        create(client, "job-t-2")
    assert "Quota" in info.value.message
    client.delete_node(name=f"{PARENT}/nodes/job-t-1").result(timeout=30)
    assert create(client, "job-t-2").state == tpu_v2.Node.State.READY


def test_injected_faults_answer_503(sim_server):
    sim_server.set_api_faults(count=1, methods=("create",))
    client = tpu_client(sim_server.endpoint)
    with pytest.raises(exceptions.ServiceUnavailable):
        client.create_node(parent=PARENT, node_id="job-t-1", node=spot_node())
    create(client, "job-t-1")


def test_get_operation_through_the_client(sim_server):
    client = tpu_client(sim_server.endpoint)
    op = client.create_node(parent=PARENT, node_id="job-t-1", node=spot_node())
    op.result(timeout=30)
    from google.longrunning import operations_pb2

    raw = client.get_operation(operations_pb2.GetOperationRequest(name=op.operation.name))
    assert raw.done and raw.name.startswith(f"{PARENT}/operations/")
