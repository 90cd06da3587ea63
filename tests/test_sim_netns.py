"""sim/netns.py: sim nodes in network namespaces of their own, on a bridge (needs root, as CI has).

- Two nodes reach each other by their own addresses, and a server on the bridge's address (where the sim's
  services bind for nodes) is reachable from a node; 127.0.0.1 inside a node is the node's own.
- A cut node's traffic really stops (a connection to it times out) and comes back when its link does.
- torch.distributed (gloo) runs across two nodes with the master address a real node address, as a multi-node
  job's generation names it.
- close() kills what ran in the namespaces and leaves no namespace, veth or bridge behind.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from sim.netns import Network
from sim_fixtures import sim_factory  # noqa: F401
from trainer_helpers import free_port

SERVE_ONCE = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
    print("listening", flush=True)
    while True:
        c, peer = s.accept(); c.sendall(("hello from " + sys.argv[1]).encode()); c.close()
""")
CONNECT = "import socket, sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).recv(100).decode())"


@pytest.fixture
def net():
    with Network() as network:
        yield network


def connect(host, address: str, port: int, timeout: float = 5) -> subprocess.CompletedProcess:
    return host.run([sys.executable, "-c", CONNECT, address, str(port), str(timeout)], capture_output=True, text=True)


def test_nodes_reach_each_other_by_address_and_a_cut_node_goes_silent(net):
    a, b = net.add_host("job-1"), net.add_host("job-2")
    assert a.address != b.address and {a.address, b.address, net.gateway} <= {str(h) for h in net.subnet.hosts()}
    server = a.popen([sys.executable, "-c", SERVE_ONCE, a.address, "7000"], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    got = connect(b, a.address, 7000)
    assert got.stdout.strip() == f"hello from {a.address}", got.stderr
    # 127.0.0.1 inside b is b's own: a's server is not there.
    assert connect(b, "127.0.0.1", 7000).returncode != 0

    a.cut()
    lost = connect(b, a.address, 7000, timeout=2)
    assert lost.returncode != 0 and "timed out" in lost.stderr, lost.stderr
    a.restore()
    assert connect(b, a.address, 7000).stdout.strip() == f"hello from {a.address}"


def test_a_server_on_the_bridge_address_serves_every_node(net):
    a = net.add_host("job-1")
    listener = socket.create_server((net.gateway, 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        conn.sendall(b"metadata server")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        got = connect(a, net.gateway, port)
        assert got.stdout.strip() == "metadata server", got.stderr
    finally:
        listener.close()


GLOO = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    rank = int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://{sys.argv[1]}", rank=rank, world_size=2)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print("sum", int(t.item()), flush=True)
    dist.destroy_process_group()
""")


def test_gloo_runs_across_two_nodes_with_a_real_master_address(net):
    a, b = net.add_host("job-1"), net.add_host("job-2")
    master = f"{a.address}:{free_port()}"
    env = {"GLOO_SOCKET_IFNAME": "eth0", "PATH": "/usr/bin:/bin"}
    procs = [host.popen([sys.executable, "-c", GLOO, master, str(rank)], env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True) for rank, host in enumerate((a, b))]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("sum 3" in out for out in outs), outs


# Inside a node: a resolver on the namespace's own 127.0.0.1:53 that answers one query "no such name" and prints the
# name asked, then the reverse lookup of a peer's address, as c10d makes of each peer that connects to its store.
LOOKUP_AT_LOOPBACK = textwrap.dedent("""
    import socket, sys, threading
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); dns.bind(("127.0.0.1", 53))
    def answer():
        query, peer = dns.recvfrom(512)
        labels, i = [], 12
        while query[i]:
            labels.append(query[i + 1:i + 1 + query[i]].decode()); i += 1 + query[i]
        print("asked", ".".join(labels), flush=True)
        dns.sendto(query[:2] + b"\\x81\\x83" + query[4:6] + bytes(6) + query[12:i + 5], peer)  # NXDOMAIN
    threading.Thread(target=answer, daemon=True).start()
    print("answer", socket.getnameinfo((sys.argv[1], 80), 0)[0], flush=True)
""")


def test_a_nodes_lookup_of_a_name_its_hosts_file_lacks_is_answered_in_its_namespace(net):
    """A VPC's resolver answers at once; this machine's, reached from a namespace, never did: c10d's lookup of each
    peer that connected to its store waited out the resolver's 10 s, twice per generation (#34 item 7)."""
    a, b = net.add_host("job-1"), net.add_host("job-2")
    got = a.run([sys.executable, "-c", LOOKUP_AT_LOOPBACK, b.address], capture_output=True, text=True, timeout=60)
    reverse = ".".join(reversed(b.address.split("."))) + ".in-addr.arpa"
    assert got.stdout.splitlines() == [f"asked {reverse}", f"answer {b.address}"], got.stderr


def test_the_gateway_keeps_its_mac_as_nodes_come_and_go(net):
    """Nodes cache the gateway's MAC: were it to change (a bridge takes its lowest port's MAC unless given one), a
    node would lose the sim's services for the seconds ARP takes to notice."""
    mac = Path(f"/sys/class/net/{net.bridge}/address")
    before = mac.read_text()
    for host in [net.add_host(f"job-{k}") for k in range(3)]:
        net.remove_host(host)
    net.add_host("job-4")
    assert mac.read_text() == before


def test_close_kills_the_nodes_processes_and_removes_every_interface():
    net = Network()
    a = net.add_host("job-1")
    sleeper = a.popen(["sleep", "300"])
    names = (a.netns, a.outside, net.bridge)
    net.close()
    assert sleeper.wait(10) == -9
    assert a.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert not any(f" {name}" in links or f" {name}@" in links for name in names[1:]), links


# ---- the sim's nodes in namespaces (SimServer(network="netns")) --------------------------------------------------

GUEST = textwrap.dedent("""
    # A sim node's guest: says what it reaches (its metadata server, a loopback server of this machine named in its
    # environment), then serves on its own address.
    import json, os, socket, urllib.request
    md = os.environ["GCE_METADATA_HOST"]
    req = urllib.request.Request(f"http://{md}/computeMetadata/v1/instance/name", headers={"Metadata-Flavor": "Google"})
    name = urllib.request.urlopen(req, timeout=10).read().decode()
    host, port = os.environ["ECHO_HOST"].rsplit(":", 1)
    echo = socket.create_connection((host, int(port)), timeout=10).recv(100).decode()
    s = socket.create_server(("0.0.0.0", 7000))
    with open("guest.json.tmp", "w") as f:  # renamed once complete: the test reads it the moment it exists
        json.dump({"name": name, "echo": echo, "echo_host": os.environ["ECHO_HOST"]}, f)
    os.replace("guest.json.tmp", "guest.json")
    while True:
        c, _ = s.accept(); c.sendall(("hello from " + name).encode()); c.close()
""")


def _echo_server():
    """A server of this machine on 127.0.0.1 only, as the emulators are."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"emulator")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def _host(sim, name):
    return sim.compute.instances[("us-central1-a", name)].runtime.host


def _reach(sim, src: str, address: str, timeout: float = 3) -> subprocess.CompletedProcess:
    return connect(_host(sim, src), address, 7000, timeout)


def test_sim_nodes_run_in_namespaces_reach_their_services_and_a_partition_or_a_loss_cuts_them_off(sim_factory):
    from google.cloud import compute_v1
    from sim_fixtures import PROJECT, compute_clients, compute_result

    echo = _echo_server()
    sim = sim_factory(network="netns", boot_command=[sys.executable, "-c", GUEST],
                      node_env={"ECHO_HOST": f"127.0.0.1:{echo.getsockname()[1]}"}, notice_seconds=1)
    instances, ops = compute_clients(sim.endpoint)
    zone = "us-central1-a"
    for name in ("job-1", "job-2", "job-3"):
        inst = compute_v1.Instance(name=name, machine_type=f"zones/{zone}/machineTypes/n1-standard-4",
                                   scheduling=compute_v1.Scheduling(provisioning_model="SPOT"))
        compute_result(ops, PROJECT, zone, instances.insert_unary(project=PROJECT, zone=zone, instance_resource=inst))
    address = {n: instances.get(project=PROJECT, zone=zone, instance=n).network_interfaces[0].network_i_p
               for n in ("job-1", "job-2", "job-3")}
    net = sim.network
    # The API lists each VM's namespace address, on the bridge's subnet.
    assert {a: _host(sim, n).address for n, a in address.items()} == {a: a for a in address.values()}
    assert all(ipaddress.ip_address(a) in net.subnet for a in address.values())
    for name in address:
        sim.wait_for(lambda n=name: (sim.node_dir(zone, n) / "guest.json").exists(), 30, f"{name}'s guest")
        seen = json.loads((sim.node_dir(zone, name) / "guest.json").read_text())
        # It reached its metadata server (on the gateway) and this machine's loopback server (relayed).
        assert seen["name"] == name and seen["echo"] == "emulator" and seen["echo_host"].startswith(net.gateway), seen
    assert _reach(sim, "job-2", address["job-1"]).stdout.strip() == "hello from job-1"

    # A partition: job-1 still runs and reaches the gateway, but no peer reaches it nor it them.
    sim.partition(zone, "job-1")
    for src, dst in (("job-2", "job-1"), ("job-1", "job-3"), ("job-3", "job-1")):
        cut = _reach(sim, src, address[dst])
        assert cut.returncode != 0 and "No route to host" in cut.stderr, (src, dst, cut.stderr)
    assert _reach(sim, "job-2", address["job-3"]).stdout.strip() == "hello from job-3"  # the others still meet
    md = sim.metadata_server(zone, "job-1").host
    ok = _host(sim, "job-1").run([sys.executable, "-c", "import socket,sys; socket.create_connection((sys.argv[1], "
                                  "int(sys.argv[2])), timeout=10)", *md.split(":")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    sim.partition(zone, "job-1", heal=True)
    assert _reach(sim, "job-2", address["job-1"]).stdout.strip() == "hello from job-1"

    # A preempted VM's link goes down as it powers off: a peer's connection gets no answer at all (no reset).
    sim.preempt(zone, "job-1")
    sim.wait_for(lambda: sim.status_of(zone, "job-1") == "TERMINATED", 30, "job-1 TERMINATED")
    lost = _reach(sim, "job-2", address["job-1"], timeout=2)
    assert lost.returncode != 0 and "timed out" in lost.stderr, lost.stderr
    # Started again: the same address, its link back.
    compute_result(ops, PROJECT, zone, instances.start_unary(project=PROJECT, zone=zone, instance="job-1"))
    sim.wait_for(lambda: _reach(sim, "job-2", address["job-1"]).returncode == 0, 30, "job-1 reachable again")
    # Deleted: its namespace is gone.
    netns = _host(sim, "job-3").netns
    compute_result(ops, PROJECT, zone, instances.delete_unary(project=PROJECT, zone=zone, instance="job-3"))
    assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    echo.close()


def test_a_netns_sim_leaves_no_namespace_bridge_or_hosts_file_when_stopped(tmp_path):
    from sim.server import SimServer

    sim = SimServer("respawn-test", nodes_root=tmp_path, network="netns", op_delay=0.01).start()
    host = sim.network.add_host("x")
    bridge = sim.network.bridge
    sim.stop()
    assert host.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not (Path("/etc/netns") / host.netns).exists()
    assert bridge not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


SLICE_GUEST = textwrap.dedent("""
    # A TPU worker's guest: resolves every worker its metadata lists; worker 0 serves on its own name (as JAX's
    # coordinator binds the address it is known by), the others connect to worker 0 by the name listed.
    import json, os, socket, time, urllib.request
    def report(seen):  # renamed once complete: the test reads it the moment it exists
        open("guest.json.tmp", "w").write(json.dumps(seen))
        os.replace("guest.json.tmp", "guest.json")
    def md(path):
        req = urllib.request.Request(f"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1/{path}",
                                     headers={"Metadata-Flavor": "Google"})
        return urllib.request.urlopen(req, timeout=10).read().decode()
    names = md("instance/attributes/worker-network-endpoints").split(",")
    worker = int(md("instance/attributes/agent-worker-number"))
    seen = {"worker": worker, "names": names, "resolved": [socket.gethostbyname(n) for n in names]}
    if worker == 0:
        s = socket.create_server((names[0], 7000))
        report(seen)
        while True:
            c, _ = s.accept(); c.sendall(b"worker 0"); c.close()
    for _ in range(100):
        try:
            seen["answer"] = socket.create_connection((names[0], 7000), timeout=3).recv(100).decode()
            break
        except OSError:
            time.sleep(0.2)
    report(seen)
""")


def test_a_tpu_slices_workers_reach_worker_0_by_the_hostname_their_metadata_lists(sim_factory):
    from google.cloud import tpu_v2
    from sim_fixtures import PROJECT, tpu_client

    sim = sim_factory(network="netns", tpu_endpoints="hostnames", boot_command=[sys.executable, "-c", SLICE_GUEST])
    zone = "us-central2-b"
    node = tpu_client(sim.endpoint).create_node(parent=f"projects/{PROJECT}/locations/{zone}", node_id="job-s-1",
                                                node=tpu_v2.Node(accelerator_type="v4-32",
                                                                 runtime_version="tpu-ubuntu2204-base")).result(30)
    ips = [e.ip_address for e in node.network_endpoints]
    workers = sim.tpu.nodes[(zone, "job-s-1")].workers
    for w in range(4):
        guest = sim.node_dir(zone, "job-s-1", w) / "guest.json"
        sim.wait_for(guest.exists, 30, f"worker {w}'s guest")
        seen = json.loads(guest.read_text())
        # The VM names (t1v-n-…-w-i), each resolving to its worker's namespace address, on every worker.
        assert seen["names"] == workers and seen["resolved"] == ips, seen
        assert all(ipaddress.ip_address(ip) in sim.network.subnet for ip in ips)
        assert w == 0 or seen["answer"] == "worker 0", seen
