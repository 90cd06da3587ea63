"""Sim nodes with addresses of their own: one Linux network namespace per node, joined by a bridge.

    with Network() as net:
        a, b = net.add_host("job-1"), net.add_host("job-2")
        a.popen([...])                  # runs inside a's namespace; a.address is a real address there
        a.cut()                         # a lost node: its link goes down, traffic to and from it stops
    # every namespace, veth and the bridge removed, the processes started in them killed

The bridge lives in the root namespace with the subnet's first address (`net.gateway`): a server that nodes must
reach (the sim's metadata server, the emulators) binds there, since a namespace has its own 127.0.0.1. The subnet
is a free /24 of 10.213.0.0/16, picked so that two test runs on one machine do not collide; interface names carry
a short random id for the same reason (Linux allows 15 characters). Needs root (CI runs as root) and iproute2.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import subprocess
from dataclasses import dataclass, field

_BASE = ipaddress.ip_network("10.213.0.0/16")


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


class Network:
    """A bridge and the namespaces of one job's nodes."""

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
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            _ip("link", "del", self.bridge, check=False)
            raise

    def add_host(self, name: str) -> Host:
        """A new node with the next address of the subnet."""
        k = len(self.hosts) + 1
        netns = f"rsp-{self.id}-{k}"
        outside, inside = f"rsv{self.id}{k}", f"rsi{self.id}{k}"
        address = str(next(self._addresses))
        host = Host(name, netns, address, outside)
        _ip("netns", "add", netns)
        self.hosts.append(host)  # from here close() removes it, whatever fails next
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        for args in (["link", "set", "lo", "up"], ["link", "set", inside, "name", "eth0"],
                     ["addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0"],
                     ["link", "set", "eth0", "up"], ["route", "add", "default", "via", self.gateway]):
            _ip("-n", netns, *args)
        return host

    def close(self) -> None:
        """Kill what runs in the namespaces (by PID, then anything left in them), then remove every interface."""
        for host in self.hosts:
            pids = set(host.pids)
            listed = _ip("netns", "pids", host.netns, check=False).stdout.split()
            pids.update(int(p) for p in listed if p.isdigit())
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("link", "del", host.outside, check=False)
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts = []

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
