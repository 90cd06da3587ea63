"""sim/'s Cloud TPU v2 subset, driven only through the real google-cloud-tpu client (REST transport)."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from sim_fixtures import PROJECT, sim_factory, sim_server, tpu_client  # noqa: F401
from test_sim_nodes import boot_info, pid_alive

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
    # Deleted twice at once (the orphan scan beside the job's own pass, as in a demo run of 2026-11-28).
    sim_server.op_delay = 1.0  # the first delete still running when the second comes
    first_delete = client.delete_node(name=f"{PARENT}/nodes/job-t-1")
    client.delete_node(name=f"{PARENT}/nodes/job-t-1").result(timeout=30)
    first_delete.result(timeout=30)
    assert create(client, "job-t-2").state == tpu_v2.Node.State.READY
    # A preempted node held no hardware from its preemption on: no delete of it is a second live period.
    [first] = [h for h in sim_server.history() if h["name"] == "job-t-1"]
    assert len(first["live"]) == 1 and first["live"][0][1] is not None


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


# ---- multi-host slices: one node, several worker VMs --------------------------------------------------------------

GUEST = [sys.executable, str(Path(__file__).resolve().parent.parent / "sim" / "probe_guest.py")]


def slice_node(accelerator: str, job: str = "job-s") -> tpu_v2.Node:
    return tpu_v2.Node(accelerator_type=accelerator, runtime_version="v2-alpha-tpuv5-lite",
                       scheduling_config=tpu_v2.SchedulingConfig(spot=True),
                       labels={"respawn-job": job}, metadata={"respawn-job": job, "respawn-attempt": "1"})


def test_api_lists_one_network_endpoint_per_worker(sim_server):
    client = tpu_client(sim_server.endpoint)
    big = create(client, "job-s-1", slice_node("v5litepod-16"))
    small = create(client, "job-s-2", slice_node("v5litepod-4"))
    ips = [e.ip_address for e in client.get_node(name=big.name).network_endpoints]
    assert len(ips) == 4 and len(set(ips)) == 4 and all(ipaddress.ip_address(ip).is_loopback for ip in ips)
    assert {e.port for e in big.network_endpoints} == {8470}
    assert len(client.get_node(name=small.name).network_endpoints) == 1
    assert not set(ips) & {e.ip_address for e in small.network_endpoints}  # distinct per node too
    with pytest.raises(exceptions.BadRequest, match="v5litepod-18"):
        client.create_node(parent=PARENT, node_id="job-s-3", node=slice_node("v5litepod-18"))
    # One node in the books (quota, capacity, history), however many workers it has.
    assert [r["name"] for r in sim_server.history()] == ["job-s-1", "job-s-2"]


@pytest.mark.parametrize("fmt", ["triples", "hostnames"])
def test_each_worker_has_its_own_metadata_and_process_and_a_preemption_takes_them_all(sim_factory, fmt):
    sim = sim_factory(boot_command=GUEST, tpu_endpoints=fmt)
    client = tpu_client(sim.endpoint)
    node = create(client, "job-s-1", slice_node("v5litepod-16"))
    ips = [e.ip_address for e in node.network_endpoints]
    dirs = [sim.node_dir(ZONE, "job-s-1", w) for w in range(4)]
    assert dirs[0] == sim.node_dir(ZONE, "job-s-1") and len(set(dirs)) == 4
    boots = [boot_info(d, sim=sim) for d in dirs]
    names, uids = [b["name"] for b in boots], sim.tpu.nodes[(ZONE, "job-s-1")].worker_ids
    # Triples: each worker VM's name, its numeric id and its address. Hostnames: on loopback, where a VM name cannot
    # be made to resolve, the addresses themselves (the names resolve in netns mode: tests/test_sim_netns.py).
    endpoints = (",".join(f"{n}:{u}:{ip}" for n, u, ip in zip(names, uids, ips)) if fmt == "triples"
                 else ",".join(ips))
    assert all(u.isdigit() for u in uids) and len(set(uids)) == 4
    for w, boot in enumerate(boots):  # each worker VM runs the boot command against its own metadata server
        assert boot["cwd"] == str(dirs[w]) and boot["name"].endswith(f"-w-{w}")
        assert boot["GCE_METADATA_HOST"] == sim.metadata_server(ZONE, "job-s-1", w).host
        attrs = boot["attributes"]
        assert attrs["agent-worker-number"] == str(w) and attrs["worker-network-endpoints"] == endpoints
        assert attrs["accelerator-type"] == "v5litepod-16" and attrs["respawn-job"] == "job-s"
    assert len({b["GCE_METADATA_HOST"] for b in boots}) == len({b["pid"] for b in boots}) == 4
    workers = [s for s in sim.instances() if s["name"] == "job-s-1"][0]["workers"]
    assert [(w["worker"], w["ipAddress"], w["processRunning"]) for w in workers] == [(i, ip, True) for i, ip in
                                                                                     enumerate(ips)]

    sim.preempt(ZONE, "job-s-1")
    sim.wait_for(lambda: client.get_node(name=node.name).state == tpu_v2.Node.State.PREEMPTED, what="PREEMPTED")
    for w, d in enumerate(dirs):  # every worker's guest got SIGTERM with its own instance/preempted TRUE
        assert (d / "events.log").read_text() == "sigterm preempted=TRUE\n", f"worker {w}"
        assert not pid_alive(boots[w]["pid"]) and not pid_alive(boots[w]["child_pid"])
    preempted = [e for e in sim.audit_log if e["protoPayload"]["methodName"] == "compute.instances.preempted"]
    assert sorted(e["protoPayload"]["resourceName"].rsplit("/", 1)[1] for e in preempted) == sorted(
        b["name"] for b in boots)
    client.delete_node(name=node.name).result(timeout=30)
    assert not any(d.exists() for d in dirs)  # a delete removes every worker's disk


def test_a_single_host_node_has_one_worker_with_cloud_tpus_attributes_for_one(sim_factory):
    sim = sim_factory(boot_command=GUEST, tpu_endpoints="triples")
    client = tpu_client(sim.endpoint)
    node = create(client, "job-t-1")
    boot = boot_info(sim.node_dir(ZONE, "job-t-1"), sim=sim)
    assert boot["name"].endswith("-w-0") and len(node.network_endpoints) == 1
    # As on every TPU VM: worker 0 of one endpoint (the agent reads it as a single host).
    assert boot["attributes"] == {"respawn-job": "job-t", "respawn-attempt": "1", "agent-worker-number": "0",
                                  "accelerator-type": V5E, "worker-network-endpoints":
                                  f"{boot['name']}:{sim.tpu.nodes[(ZONE, 'job-t-1')].worker_id}:"
                                  f"{node.network_endpoints[0].ip_address}"}
    with pytest.raises(Exception, match="no worker 1"):
        sim.metadata_server(ZONE, "job-t-1", 1)
