"""sim/netns.py: sim nodes in network namespaces of their own, on a bridge (needs root, as CI has).

- Two nodes reach each other by their own addresses, and a server on the bridge's address (where the sim's
  services bind for nodes) is reachable from a node; 127.0.0.1 inside a node is the node's own.
- A cut node's traffic really stops (a connection to it times out) and comes back when its link does.
- torch.distributed (gloo) runs across two nodes with the master address a real node address, as a multi-node
  job's generation names it.
- close() kills what ran in the namespaces and leaves no namespace, veth or bridge behind.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from sim.netns import Network
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
