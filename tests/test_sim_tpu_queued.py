"""sim/'s Cloud TPU v2 queued resources (sim/tpu_queued.py, gcp-facts §19), driven only through the real
google-cloud-tpu client (tpu_v2, REST transport): the states, the wait for capacity, the wait's end, a Spot
request's preemption, the delete rules and the quota a request holds."""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.protobuf import duration_pb2

from sim_fixtures import PROJECT, sim_factory, sim_server, tpu_client  # noqa: F401
from test_sim_tpu import V5E, spot_node

ZONE = "europe-west4-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
S = tpu_v2.QueuedResourceState.State


def request(qr_id: str, *, spot: bool = True, wait_s: int | None = None, job: str = "job-q") -> tpu_v2.QueuedResource:
    node = spot_node(job)
    node.scheduling_config = tpu_v2.SchedulingConfig()  # the tier is the request's, not the node's
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=PARENT, node_id=qr_id, node=node)]))
    if spot:
        qr.spot = tpu_v2.QueuedResource.Spot()
    else:
        qr.guaranteed = tpu_v2.QueuedResource.Guaranteed()
    if wait_s is not None:
        qr.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=wait_s))
    return qr


def create(client, qr_id: str, **kw) -> tpu_v2.QueuedResource:
    return client.create_queued_resource(parent=PARENT, queued_resource_id=qr_id,
                                         queued_resource=request(qr_id, **kw)).result(timeout=30)


def state(client, qr_id: str):
    return client.get_queued_resource(name=f"{PARENT}/queuedResources/{qr_id}").state.state


def wait_state(sim, client, qr_id: str, want, timeout: float = 20):
    sim.wait_for(lambda: state(client, qr_id) == want, timeout=timeout, what=f"{qr_id} {want.name}")


def test_a_request_waits_for_capacity_then_its_node_runs_active(sim_server):
    client = tpu_client(sim_server.endpoint)
    sim_server.set_capacity(ZONE, V5E, 0)
    qr = create(client, "job-q-1")
    assert qr.name == f"{PARENT}/queuedResources/job-q-1" and qr.spot is not None
    wait_state(sim_server, client, "job-q-1", S.WAITING_FOR_RESOURCES)
    assert sim_server.live_nodes() == []  # a waiting request holds no hardware
    sim_server.set_capacity(ZONE, V5E, 1)
    wait_state(sim_server, client, "job-q-1", S.ACTIVE)
    node = client.get_node(name=f"{PARENT}/nodes/job-q-1")
    assert node.state == tpu_v2.Node.State.READY
    assert node.queued_resource == f"{PARENT}/queuedResources/job-q-1"
    assert node.labels["respawn-job"] == "job-q"
    states = [s for _, s in sim_server.request_history()[0]["states"]]
    assert states == ["CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]


def test_first_asked_first_served(sim_server):
    client = tpu_client(sim_server.endpoint)
    sim_server.set_capacity(ZONE, V5E, 0)
    for i in (1, 2):
        create(client, f"job-q-{i}")
    sim_server.set_capacity(ZONE, V5E, 1)
    wait_state(sim_server, client, "job-q-1", S.ACTIVE)
    assert state(client, "job-q-2") == S.WAITING_FOR_RESOURCES


def test_the_wait_ends_failed_and_the_request_holds_quota_until_deleted(sim_server):
    client = tpu_client(sim_server.endpoint)
    sim_server.set_capacity(ZONE, V5E, 0)
    sim_server.set_quota("europe-west4", V5E, 1, provisioning_model="SPOT")
    create(client, "job-q-1", wait_s=1)
    wait_state(sim_server, client, "job-q-1", S.FAILED)
    got = client.get_queued_resource(name=f"{PARENT}/queuedResources/job-q-1")
    assert "valid_until_duration" in got.state.failed_data.error.message
    assert got.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    with pytest.raises(exceptions.ResourceExhausted, match="Quota 'TPUPreemptiblePerProjectPerRegionForTPUAPI'"):
        create(client, "job-q-2")  # the FAILED request still holds the region's one
    client.delete_queued_resource(name=f"{PARENT}/queuedResources/job-q-1").result(timeout=30)  # no force: FAILED
    sim_server.set_capacity(ZONE, V5E, 1)
    create(client, "job-q-2")
    wait_state(sim_server, client, "job-q-2", S.ACTIVE)


def test_a_preempted_spot_request_is_suspended_with_its_node_deleted(sim_server):
    client = tpu_client(sim_server.endpoint)
    create(client, "job-q-1")
    wait_state(sim_server, client, "job-q-1", S.ACTIVE)
    sim_server.preempt(ZONE, "job-q-1")
    wait_state(sim_server, client, "job-q-1", S.SUSPENDED)
    got = client.get_queued_resource(name=f"{PARENT}/queuedResources/job-q-1")
    assert got.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/job-q-1")
    assert "SUSPENDING" in [s for _, s in sim_server.request_history()[0]["states"]]
    assert [e["protoPayload"]["methodName"] for e in sim_server.audit_log
            if e["protoPayload"]["methodName"] == "tpu.nodes.terminate"] == ["tpu.nodes.terminate"]
    assert sim_server.max_live() == 1 and sim_server.live_nodes() == []


def test_delete_without_force_is_refused_while_active_and_force_deletes_the_node_first(sim_server):
    client = tpu_client(sim_server.endpoint)
    create(client, "job-q-1", spot=False)
    wait_state(sim_server, client, "job-q-1", S.ACTIVE)
    with pytest.raises(exceptions.BadRequest, match="ACTIVE.*force"):
        client.delete_queued_resource(name=f"{PARENT}/queuedResources/job-q-1")
    client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(
        name=f"{PARENT}/queuedResources/job-q-1", force=True)).result(timeout=30)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/job-q-1")
    assert list(client.list_queued_resources(parent=PARENT)) == []
    assert sim_server.live_nodes() == [] and sim_server.queued_resources() == []
    node = sim_server.history()[0]
    assert node["deletedAt"] is not None and node["provisioningModel"] == "STANDARD"


def test_duplicate_create_is_409_and_bad_requests_are_400(sim_server):
    client = tpu_client(sim_server.endpoint)
    create(client, "job-q-1")
    with pytest.raises(exceptions.Conflict):
        create(client, "job-q-1")
    bad = request("job-q-2")
    bad.tpu.node_spec[0].parent = "projects/other/locations/us-central1-a"
    with pytest.raises(exceptions.BadRequest, match="parent"):
        client.create_queued_resource(parent=PARENT, queued_resource_id="job-q-2", queued_resource=bad)
    with pytest.raises(exceptions.NotFound):
        client.delete_queued_resource(name=f"{PARENT}/queuedResources/nope")
