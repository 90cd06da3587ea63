"""Sim nodes with addresses of their own: one Linux network namespace per node, joined by a bridge.

    with Network() as net:
        a, b = net.add_host("job-1"), net.add_host("job-2")
        a.popen([...])                  # runs inside a's namespace; a.address is a real address there
        a.cut()                         # a lost node: its link goes down, traffic to and from it stops
    # every namespace, veth and the bridge removed, the processes started in them killed

    net.partition(a)                    # a keeps its link (it reaches the gateway) but no other node, nor they it
    port = net.relay(8080)              # a node reaches this machine's 127.0.0.1:8080 at net.gateway:port

The bridge lives in the root namespace with the subnet's first address (`net.gateway`): a server that nodes must
reach (the sim's metadata server, the emulators) binds there, since a namespace has its own 127.0.0.1. The subnet
is a free /24 of 10.213.0.0/16, picked so that two test runs on one machine do not collide; interface names carry
a short random id for the same reason (Linux allows 15 characters). Needs root (CI runs as root) and iproute2.

A node's host name resolves to its own address inside its namespace (/etc/netns/NS/hosts, which `ip netns exec`
mounts over /etc/hosts), as a VM's does: gloo and torchrun pick the interface they advertise by it. The VMs of one
node (a TPU slice's workers) resolve each other's names too (`resolve_each_other`), as a VPC's internal DNS resolves
VM names: a worker reaches worker 0 by the hostname its metadata lists. Any other lookup is refused at once (the
namespace's resolver is its own loopback), as a VPC's resolver answers at once.
A partition is a pair of `unreachable` routes between the partitioned node and every other node (a connect fails
with EHOSTUNREACH, an open connection's packets go nowhere: a collective hangs), none towards the gateway.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

_BASE = ipaddress.ip_network("10.213.0.0/16")
_ETC_NETNS = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*
# An endpoint on this machine's loopback, as an environment value names it (host:port or a URL).
_LOOPBACK_ENDPOINT = re.compile(r"(?<![\w.])(?:127\.0\.0\.1|localhost):(\d{1,5})\b")


def available() -> str | None:
    """None when this process can make sim networks; else why not (what to do)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed: apt-get install iproute2"
    return None


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetnsError("`ip` (iproute2) is not installed: apt-get install iproute2") from None
    if check and done.returncode != 0:
        hint = " (network namespaces need root)" if "Operation not permitted" in done.stderr else ""
        raise NetnsError(f"ip {' '.join(args)} failed: {done.stderr.strip()}{hint}")
    return done


def _used_subnets() -> set[ipaddress.IPv4Network]:
    out = _ip("-4", "-o", "addr", "show").stdout
    return {ipaddress.ip_interface(line.split()[3]).network for line in out.splitlines() if len(line.split()) > 3}


@dataclass
class Host:
    """One node: a namespace with one interface (eth0) on the job's bridge."""

    name: str
    netns: str
    address: str
    outside: str  # the veth end on the bridge, in the root namespace
    pids: list[int] = field(default_factory=list)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start argv inside this node's namespace; the process is killed when the network closes."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kwargs)
        self.pids.append(proc.pid)
        return proc

    def run(self, argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], timeout=timeout, **kwargs)

    def cut(self) -> None:
        """The node is lost: its link goes down (packets to and from it are dropped; its processes live on until
        killed, as on a VM whose network dies first)."""
        _ip("link", "set", self.outside, "down")

    def restore(self) -> None:
        _ip("link", "set", self.outside, "up")


class _Relay:
    """gateway:port → 127.0.0.1:target, two pumping threads per connection: a node's way to a server of this machine
    that binds loopback only (the emulators), since a namespace has a loopback of its own."""

    def __init__(self, gateway: str, target: int) -> None:
        self.target = target
        self._listener = socket.create_server((gateway, 0))
        self.port = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"relay-{target}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns.update((conn, upstream))
            pending = [2]  # the second pump to end closes both sockets (never one under a running recv)
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst, pending), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pending: list[int]) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # pass the half-close on
        except OSError:
            for sock in (src, dst):  # one side broke: end the other pump too
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self._lock:
            pending[0] -= 1
            last = pending[0] == 0
            if last:
                self._conns.difference_update((src, dst))
        if last:
            src.close()
            dst.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for sock in conns:  # the pumps see the shutdown and close them
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Network:
    """A bridge and the namespaces of the nodes on it."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(2)
        used = _used_subnets()
        free = [n for n in _BASE.subnets(new_prefix=24) if n not in used]
        if not free:
            raise NetnsError(f"no free /24 left in {_BASE} for a sim network")
        self.subnet = free[int.from_bytes(secrets.token_bytes(2), "big") % len(free)]
        self._addresses = self.subnet.hosts()
        self.gateway = str(next(self._addresses))
        self.bridge = f"rspbr{self.id}"
        self.hosts: list[Host] = []
        self.partitioned: set[str] = set()  # addresses of partitioned hosts
        self._count = 0
        self._relays: dict[int, _Relay] = {}
        self._lock = threading.RLock()
        # A bridge takes the lowest MAC of its ports unless given one: removing that port would change the
        # gateway's MAC under the nodes' ARP caches, cutting them off from the sim's services for seconds.
        mac = "02:72:73:" + ":".join(self.id[i:i + 2] for i in (0, 2)) + ":01"
        _ip("link", "add", self.bridge, "address", mac, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            _ip("link", "del", self.bridge, check=False)
            raise

    def add_host(self, name: str) -> Host:
        """A new node with the next address of the subnet (addresses are not reused within a network)."""
        with self._lock:
            self._count += 1
            k = self._count
            address = str(next(self._addresses, "") or "")
            if not address:
                raise NetnsError(f"sim network {self.subnet} has no address left for node {name}")
            netns = f"rsp-{self.id}-{k}"
            outside, inside = f"rsv{self.id}{k}", f"rsi{self.id}{k}"
            host = Host(name, netns, address, outside)
            _ip("netns", "add", netns)
            self.hosts.append(host)  # from here close() removes it, whatever fails next
        (_ETC_NETNS / netns).mkdir(parents=True, exist_ok=True)
        self._write_hosts(host, [])
        # A VPC's resolver (the metadata server) answers at once. This machine's, reached from a namespace through
        # the bridge, never answers: each lookup not in the hosts file (c10d asks the name of every peer that
        # connects to its store) waited 10 s. Nothing serves port 53 on the namespace's loopback: refused at once.
        (_ETC_NETNS / netns / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        for args in (["link", "set", "lo", "up"], ["link", "set", inside, "name", "eth0"],
                     ["addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0"],
                     ["link", "set", "eth0", "up"], ["route", "add", "default", "via", self.gateway]):
            _ip("-n", netns, *args)
        with self._lock:
            for other in self.partitioned:  # a newcomer does not reach a partitioned node either
                self._route("add", host, other)
                self._route("add", self._by_address(other), address)
        return host

    @staticmethod
    def _write_hosts(host: Host, peers: list[Host]) -> None:
        lines = ["127.0.0.1\tlocalhost", f"{host.address}\t{socket.gethostname()} {host.name}"]
        lines += [f"{p.address}\t{p.name}" for p in peers if p is not host]
        (_ETC_NETNS / host.netns / "hosts").write_text("\n".join(lines) + "\n")

    def resolve_each_other(self, hosts: list[Host]) -> None:
        """Every one of `hosts` resolves every other's name to its address (before anything runs in them)."""
        for host in hosts:
            self._write_hosts(host, hosts)

    def _by_address(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    @staticmethod
    def _route(verb: str, host: Host, address: str) -> None:
        """verb add (idempotent) or del: the route that keeps `host` from `address`."""
        _ip("-n", host.netns, "route", "replace" if verb == "add" else "del", "unreachable", f"{address}/32",
            check=verb == "add")

    def partition(self, host: Host) -> None:
        """`host` keeps its link and reaches the gateway (the sim's services), but no other node reaches it nor it
        them: a connect fails, and what was under way goes nowhere (a collective hangs)."""
        with self._lock:
            if host.address in self.partitioned:
                return
            self.partitioned.add(host.address)
            for other in self.hosts:
                if other is not host:
                    self._route("add", other, host.address)
                    self._route("add", host, other.address)

    def heal(self, host: Host) -> None:
        """Undo partition(host)."""
        with self._lock:
            if host.address not in self.partitioned:
                return
            self.partitioned.discard(host.address)
            for other in self.hosts:
                if other is not host and other.address not in self.partitioned:  # else still apart: other is
                    self._route("del", other, host.address)
                    self._route("del", host, other.address)

    def relay(self, port: int) -> int:
        """The port on the gateway at which a node reaches this machine's 127.0.0.1:`port` (made once per port)."""
        with self._lock:
            if port not in self._relays:
                self._relays[port] = _Relay(self.gateway, port)
            return self._relays[port].port

    def node_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` for a process in a node: every loopback endpoint in a value (127.0.0.1:PORT, localhost:PORT, as
        FIRESTORE_EMULATOR_HOST or a URL names it) becomes its relay on the gateway, since the node's own 127.0.0.1
        is not this machine's."""
        return {k: _LOOPBACK_ENDPOINT.sub(lambda m: f"{self.gateway}:{self.relay(int(m.group(1)))}", v)
                for k, v in env.items()}

    @staticmethod
    def _kill(host: Host) -> None:
        pids = set(host.pids)
        listed = _ip("netns", "pids", host.netns, check=False).stdout.split()
        pids.update(int(p) for p in listed if p.isdigit())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove_host(self, host: Host) -> None:
        """A deleted node: what runs in its namespace is killed, its namespace, veth and routes go."""
        with self._lock:
            if host not in self.hosts:
                return
            if host.address in self.partitioned:
                self.heal(host)
            for other in self.partitioned:
                self._route("del", host, other)
            self.hosts.remove(host)
        self._remove(host)

    def _remove(self, host: Host) -> None:
        self._kill(host)
        _ip("link", "del", host.outside, check=False)
        _ip("netns", "del", host.netns, check=False)
        shutil.rmtree(_ETC_NETNS / host.netns, ignore_errors=True)

    def close(self) -> None:
        """Kill what runs in the namespaces (by PID, then anything left in them), then remove every interface."""
        with self._lock:
            hosts, self.hosts = list(self.hosts), []
            relays, self._relays = list(self._relays.values()), {}
            self.partitioned = set()
        for relay in relays:
            relay.close()
        for host in hosts:
            self._remove(host)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
