"""`python -m sim serve`: the APIs and the /sim/ control API over plain HTTP, loopback only, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions

from sim.nodes import group_alive
from sim_fixtures import compute_clients, compute_result
from test_sim_compute import spot_instance

PROJECT = "respawn-test"  # spot_instance builds accelerator URLs with this project
ZONE = "us-central1-a"


def listening_addresses(pid: int) -> list[str]:
    """Local addresses of the LISTEN sockets that process `pid` holds (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                out.append(cols[1])
    return out


def poll(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


@pytest.fixture
def served(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--host", "127.0.0.1", "--port", "0", "--project", PROJECT,
         "--notice-seconds", "0.5", "--op-delay", "0.02", "--nodes-root", str(tmp_path / "nodes"),
         "--boot-command", f"{sys.executable} {Path(__file__).resolve().parent.parent / 'sim' / 'probe_guest.py'} --ignore-sigterm"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    line = proc.stdout.readline()
    assert "serving project" in line, line + proc.stdout.read()
    endpoint = line.split(" at ")[1].split()[0]
    yield proc, endpoint, tmp_path / "nodes"
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_serve_alone_with_control_api(served):
    proc, endpoint, nodes = served
    instances, ops = compute_clients(endpoint)
    compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1")))
    snap = requests.get(f"{endpoint}/sim/instances", timeout=5).json()
    [inst] = snap["instances"]
    assert inst["status"] == "RUNNING" and inst["metadataHost"].startswith("127.0.0.1:")
    assert [n["name"] for n in snap["live"]] == ["job-a-1"]
    boot = nodes / "compute" / ZONE / "job-a-1" / "boot-1.json"
    assert requests.get(f"{endpoint}/sim/clock", timeout=5).json()["now"] > 0
    poll(boot.exists, "the node's boot command to run")

    listening = listening_addresses(proc.pid)
    assert len(listening) == 2, listening  # the API and the node's metadata server
    assert all(addr.startswith("0100007F:") for addr in listening), listening

    r = requests.post(f"{endpoint}/sim/capacity", json={"zone": ZONE, "acceleratorType": "nvidia-tesla-t4", "count": 0}, timeout=5)
    assert r.status_code == 200
    with pytest.raises(exceptions.ServiceUnavailable):
        compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-b-1")))
    assert requests.post(f"{endpoint}/sim/preempt", json={"zone": ZONE, "name": "job-a-1"}, timeout=5).status_code == 200
    assert requests.post(f"{endpoint}/sim/preempt", json={"zone": ZONE, "name": "nope"}, timeout=5).status_code == 409
    poll(lambda: instances.get(project=PROJECT, zone=ZONE, instance="job-a-1").status == "TERMINATED",
         "the preempted instance to be TERMINATED")
    entries = requests.get(f"{endpoint}/sim/audit", timeout=5).json()["entries"]
    assert "compute.instances.preempted" in [e["protoPayload"]["methodName"] for e in entries]
    history = requests.get(f"{endpoint}/sim/history", timeout=5).json()["nodes"]
    assert history[0]["states"][-1][1] == "TERMINATED"

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_serve_stop_ends_node_processes(served):
    proc, endpoint, nodes = served
    instances, ops = compute_clients(endpoint)
    compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1")))
    pid = requests.get(f"{endpoint}/sim/instances", timeout=5).json()["instances"][0]["pid"]
    proc.send_signal(signal.SIGTERM)
    # A liveness bound, not a timing: stop() may spend its own waits (HTTP 5 s, scheduler 5 s, the guest's process
    # group 10 s, the metadata server 5 s) on a loaded 2-core CI machine.
    assert proc.wait(timeout=90) == 0
    assert not group_alive(pid)


def test_serve_refuses_a_non_loopback_host():
    out = subprocess.run([sys.executable, "-m", "sim", "serve", "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "127.0.0.1 only" in out.stderr
