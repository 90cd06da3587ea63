"""Nodes as processes: boot on RUNNING/READY, the per-node metadata server, preemption (notice, SIGTERM, kill),
host errors, maintenance events, the node disk across stop/start, and cleanup. Driven through the real clients."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions
from google.cloud import tpu_v2

from sim.nodes import group_alive
from sim_fixtures import PROJECT, compute_clients, compute_result, sim_factory, tpu_client  # noqa: F401
from test_sim_compute import ZONE, spot_instance

GUEST = [sys.executable, str(Path(__file__).resolve().parent.parent / "sim" / "probe_guest.py")]
STUBBORN = GUEST + ["--ignore-sigterm"]
TPU_ZONE = "europe-west4-a"
H = {"Metadata-Flavor": "Google"}


def boot_info(node_dir: Path, n: int = 1, sim=None) -> dict:
    path = node_dir / f"boot-{n}.json"
    sim.wait_for(path.exists, timeout=30, what=f"boot {n} of {node_dir.name}")
    return json.loads(path.read_text())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of an exited guest counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def running_instance(sim, name="job-a-1", action="STOP"):
    instances, ops = compute_clients(sim.endpoint)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance(name, action=action))
    compute_result(ops, PROJECT, ZONE, op)
    return instances, ops


def test_boot_runs_the_command_in_the_node_dir_with_its_own_metadata_server(sim_factory):
    sim = sim_factory(boot_command=GUEST, node_env={"RESPAWN_EXTRA": "x"})
    running_instance(sim)
    node_dir = sim.node_dir(ZONE, "job-a-1")
    info = boot_info(node_dir, sim=sim)
    assert info["cwd"] == str(node_dir) == info["RESPAWN_NODE_DIR"]
    assert info["GCE_METADATA_HOST"] == sim.metadata_server(ZONE, "job-a-1").host
    assert info["GCE_METADATA_HOST"].startswith("127.0.0.1:")
    assert info["name"] == "job-a-1"
    assert info["attributes"] == {"respawn-job": "job-a", "respawn-attempt": "1"}
    [snap] = sim.instances()
    assert snap["processRunning"] and snap["pid"] == info["pid"]
    assert os.getpgid(info["pid"]) == info["pid"], "the guest runs as its own process group"


def test_preemption_with_stop_notice_then_terminated_and_disk_survives_restart(sim_factory):
    sim = sim_factory(boot_command=GUEST)
    instances, ops = running_instance(sim)
    node_dir = sim.node_dir(ZONE, "job-a-1")
    info = boot_info(node_dir, sim=sim)
    md = sim.metadata_server(ZONE, "job-a-1")
    assert requests.get(md.url + "instance/preempted", headers=H, timeout=5).text == "FALSE"
    sim.preempt(ZONE, "job-a-1")
    sim.wait_for(lambda: sim.status_of(ZONE, "job-a-1") == "TERMINATED", what="TERMINATED after preemption")
    # The guest read TRUE in its SIGTERM handler; asked from here after preempt(), the server may already be gone.
    assert (node_dir / "events.log").read_text() == "sigterm preempted=TRUE\n"
    assert not pid_alive(info["pid"]) and not pid_alive(info["child_pid"])
    assert instances.get(project=PROJECT, zone=ZONE, instance="job-a-1").status == "TERMINATED"
    assert node_dir.exists()
    compute_result(ops, PROJECT, ZONE, instances.start_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    second = boot_info(node_dir, 2, sim=sim)
    assert (node_dir / "boot-1.json").exists(), "the node's disk survives stop/start"
    md2 = sim.metadata_server(ZONE, "job-a-1")
    assert requests.get(md2.url + "instance/preempted", headers=H, timeout=5).text == "FALSE"
    assert second["pid"] != info["pid"]


def test_guest_that_ignores_sigterm_is_killed_after_the_notice(sim_factory):
    sim = sim_factory(boot_command=STUBBORN, notice_seconds=0.5)
    running_instance(sim)
    node_dir = sim.node_dir(ZONE, "job-a-1")
    info = boot_info(node_dir, sim=sim)
    sim.preempt(ZONE, "job-a-1")
    sim.wait_for(lambda: sim.status_of(ZONE, "job-a-1") == "TERMINATED", what="TERMINATED after the notice")
    assert (node_dir / "events.log").read_text().startswith("sigterm preempted=TRUE")
    assert not group_alive(info["pid"]) and not pid_alive(info["child_pid"])


def test_preemption_with_delete_removes_instance_and_disk(sim_factory):
    sim = sim_factory(boot_command=GUEST)
    instances, _ = running_instance(sim, action="DELETE")
    node_dir = sim.node_dir(ZONE, "job-a-1")
    boot_info(node_dir, sim=sim)
    sim.preempt(ZONE, "job-a-1")
    sim.wait_for(lambda: sim.status_of(ZONE, "job-a-1") is None, what="instance deleted after preemption")
    with pytest.raises(exceptions.NotFound):
        instances.get(project=PROJECT, zone=ZONE, instance="job-a-1")
    assert not node_dir.exists()


def test_delete_kills_processes_and_removes_the_disk(sim_factory):
    sim = sim_factory(boot_command=GUEST)
    instances, ops = running_instance(sim)
    node_dir = sim.node_dir(ZONE, "job-a-1")
    info = boot_info(node_dir, sim=sim)
    compute_result(ops, PROJECT, ZONE, instances.delete_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    assert not node_dir.exists()
    assert not pid_alive(info["pid"]) and not pid_alive(info["child_pid"])


def test_host_error_kills_at_once_without_notice(sim_factory):
    sim = sim_factory(boot_command=GUEST)
    running_instance(sim)
    node_dir = sim.node_dir(ZONE, "job-a-1")
    info = boot_info(node_dir, sim=sim)
    sim.host_error(ZONE, "job-a-1")
    assert sim.status_of(ZONE, "job-a-1") == "TERMINATED"
    assert not (node_dir / "events.log").exists(), "a host error gives the guest no SIGTERM"
    assert not pid_alive(info["pid"])
    assert sim.audit_log[-1]["protoPayload"]["methodName"] == "compute.instances.hostError"


def test_maintenance_event_reaches_the_metadata_server(sim_factory):
    sim = sim_factory()
    running_instance(sim)
    md = sim.metadata_server(ZONE, "job-a-1")
    sim.maintenance_event(ZONE, "job-a-1")
    assert requests.get(md.url + "instance/maintenance-event", headers=H, timeout=5).text == "TERMINATE_ON_HOST_MAINTENANCE"


def test_tpu_node_boots_and_is_preempted(sim_factory):
    sim = sim_factory(boot_command=GUEST)
    client = tpu_client(sim.endpoint)
    parent = f"projects/{PROJECT}/locations/{TPU_ZONE}"
    node = tpu_v2.Node(accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite",
                       scheduling_config=tpu_v2.SchedulingConfig(spot=True),
                       labels={"respawn-job": "job-t"}, metadata={"respawn-job": "job-t", "respawn-attempt": "2"})
    client.create_node(parent=parent, node_id="job-t-2", node=node).result(timeout=30)
    node_dir = sim.node_dir(TPU_ZONE, "job-t-2")
    info = boot_info(node_dir, sim=sim)
    # The node's own metadata, and what Cloud TPU adds on every TPU VM, a single host included (gcp-facts §13).
    assert {k: info["attributes"].pop(k) for k in ("agent-worker-number", "accelerator-type")} == {
        "agent-worker-number": "0", "accelerator-type": "v5litepod-8"}
    endpoints = info["attributes"].pop("worker-network-endpoints")
    assert endpoints and "," not in endpoints  # one worker (its hostname or IP, in the sim's format)
    assert info["attributes"] == {"respawn-job": "job-t", "respawn-attempt": "2"}
    assert info["name"].startswith("t1v-n-") and info["name"].endswith("-w-0")
    sim.preempt(TPU_ZONE, "job-t-2")
    sim.wait_for(lambda: client.get_node(name=f"{parent}/nodes/job-t-2").state == tpu_v2.Node.State.PREEMPTED,
                 what="TPU node PREEMPTED")
    assert (node_dir / "events.log").read_text() == "sigterm preempted=TRUE\n"
    assert not pid_alive(info["pid"]) and not pid_alive(info["child_pid"])
    client.delete_node(name=f"{parent}/nodes/job-t-2").result(timeout=30)
    assert not node_dir.exists()


def test_stop_ends_every_node_process_and_metadata_server(sim_factory):
    sim = sim_factory(boot_command=STUBBORN)
    running_instance(sim, "job-a-1")
    running_instance(sim, "job-b-1")
    infos = [boot_info(sim.node_dir(ZONE, n), sim=sim) for n in ("job-a-1", "job-b-1")]
    hosts = [sim.metadata_server(ZONE, n).host for n in ("job-a-1", "job-b-1")]
    sim.stop()
    for info in infos:
        assert not group_alive(info["pid"]) and not pid_alive(info["child_pid"])
    for host in hosts:
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{host}/computeMetadata/v1/instance/name", headers=H, timeout=2)


def test_history_counts_simultaneously_live_nodes_per_job(sim_factory):
    sim = sim_factory()
    instances, ops = running_instance(sim, "job-a-1")
    compute_result(ops, PROJECT, ZONE, instances.delete_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    running_instance(sim, "job-a-2")
    assert sim.max_live("job-a") == 1
    extra = spot_instance("job-a-3")
    compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=extra))
    assert sim.max_live("job-a") == 2
    assert sorted(n["name"] for n in sim.live_nodes("job-a")) == ["job-a-2", "job-a-3"]
    assert sim.max_live("job-b") == 0
    [first] = [r for r in sim.history() if r["name"] == "job-a-1"]
    assert first["zone"] == ZONE and first["deletedAt"] is not None and first["live"][0][1] is not None
