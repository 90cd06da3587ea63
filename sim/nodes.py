"""A simulated node's guest side: its disk (a directory), its metadata server, and what its systemd unit runs.

Booting starts the metadata server and, when a boot command is configured, runs it as its own process group with
cwd = the node's directory and env = os.environ + node_env + GCE_METADATA_HOST/GCE_METADATA_IP + RESPAWN_NODE_DIR;
`{node_dir}` in a node_env value becomes the node's directory (what lives on the node's disk, per node).
The directory survives stop/start (a persistent disk) and is removed on delete. The console output of every boot
is appended to `<node dir>.console.log`, next to (not inside) the disk.

In the sim's netns mode a node has a network namespace of its own (`host`, sim/netns.py): its processes run there,
its metadata server binds the bridge's gateway, and the loopback endpoints its environment names are relayed
(Network.node_env). Its link goes down when it powers off (before its processes are killed, so its peers see a host
gone silent, not connections reset, as on a VPC) and comes back at its next boot; delete removes the namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

from respawn.agent.supervisor import processes_with
from sim.emulators import group_alive
from sim.metadata import MetadataServer
from sim.netns import Host, Network
from sim import node_containers
from sim.node_containers import NodeContainers, netns_prefix


def guest_pids(boot_id: str, node_dir: Path | None = None) -> list[int]:
    """Every process of one boot of a node: they all carry its RESPAWN_BOOT_ID, whatever process group or session
    they moved to (the agent starts the trainer in a group of its own). A real power-off takes them all. With
    `node_dir`, also the node's containers: podman's conmon (a daemon: its environment is its own, its parent
    init) names the node's container storage on its command line, and everything below it is the container's."""
    found = set(processes_with(f"RESPAWN_BOOT_ID={boot_id}".encode()))
    if node_dir is not None:
        storage = f"{node_dir}/containers/".encode()
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if storage in f.read():
                        found.add(int(entry))
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:  # gone
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry))
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return sorted(found)


class NodeRuntime:
    def __init__(self, *, directory: Path, boot_command: list[str] | None, node_env: dict | None,
                 metadata_kwargs: dict, network: Network | None = None, host: Host | None = None,
                 metadata_server: bool = True, containers: NodeContainers | None = None) -> None:
        self.directory = directory
        self.metadata_server = metadata_server  # False: no guest at all (benchmarks of thousands of nodes)
        self.network, self.host = network, host  # netns mode: this node's namespace on the sim's bridge
        self.console_log = directory.with_name(directory.name + ".console.log")
        self.boot_command = boot_command
        self.node_env = dict(node_env or {})
        self.metadata_kwargs = metadata_kwargs
        self.containers = containers  # its container runtime's configuration (sim/node_containers.py), if any
        self.metadata: MetadataServer | None = None
        self.proc: subprocess.Popen | None = None
        self.exit_codes: list[int | None] = []  # one per boot, in order
        self.boot_id: str | None = None
        self._lock = threading.Lock()

    def snapshot(self, kind: str, zone: str, name: str, status: str, labels: dict, attributes: dict) -> dict:
        """What SimServer.instances() lists of the node this runtime is (a TPU node's: of one of its workers)."""
        return {"kind": kind, "zone": zone, "name": name, "status": status, "labels": dict(labels),
                "attributes": attributes, "nodeDir": str(self.directory),
                "metadataHost": self.metadata.host if self.metadata else None,
                "pid": self.pid, "processRunning": self.running()}

    def set_attributes(self, removed: set[str], values: dict[str, str]) -> None:
        """The node's metadata attributes changed: `removed` gone, `values` set. A running node's metadata server
        serves them at once (waking its hanging GETs); a node not booted yet gets them at boot."""
        attributes = self.metadata_kwargs.setdefault("attributes", {})
        for key in removed:
            attributes.pop(key, None)
        attributes.update(values)
        if self.metadata is not None:
            for key in removed:
                self.metadata.delete(f"instance/attributes/{key}")
            for key, value in values.items():
                self.metadata.set_attribute(key, value)

    def _guest(self) -> list[int]:
        """This boot's processes (its containers' too, when the node runs containers)."""
        return guest_pids(self.boot_id or "", self.directory if self.containers is not None else None)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        if self.proc is None:
            return False
        return self.proc.poll() is None or group_alive(self.proc.pid) or bool(self._guest())

    def boot(self, boot_env: dict[str, str] | None = None) -> None:
        """Power on: a fresh metadata server (preempted=FALSE) and the boot command, if any (`boot_env`: what this
        boot adds to its environment)."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not self.metadata_server:
                return
            bind = self.network.gateway if self.network is not None else "127.0.0.1"
            self.metadata = MetadataServer(**self.metadata_kwargs, bind=bind).start()
            if self.host is not None:
                self.host.restore()  # powered on again: its link is back
            if not self.boot_command:
                return
            env = dict(os.environ)
            env.update({k: str(v).replace("{node_dir}", str(self.directory)) for k, v in self.node_env.items()})
            if self.network is not None:
                env = self.network.node_env(env)
            env["GCE_METADATA_HOST"] = self.metadata.host
            env["GCE_METADATA_IP"] = self.metadata.host  # google-auth pings this one
            env["RESPAWN_NODE_DIR"] = str(self.directory)
            if self.containers is not None:
                reach = (lambda host: self.network.node_env({"host": host})["host"]) if self.network else None
                env.update(self.containers.prepare(self.directory, reach))
            env.update(boot_env or {})
            # A fresh id per boot, as the kernel's boot_id: the agent tells a reboot from its own restart by it.
            self.boot_id = env["RESPAWN_BOOT_ID"] = uuid.uuid4().hex
            argv = list(self.boot_command)
            if self.host is not None:
                prefix = netns_prefix() if self.containers is not None else []  # runc needs the cgroups
                argv = ["ip", "netns", "exec", self.host.netns, *prefix, *argv]  # execs argv: the same process
            with open(self.console_log, "ab") as log:
                self.proc = subprocess.Popen(
                    argv, cwd=self.directory, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def _cut(self) -> None:
        """The VM is off: its link goes, before its processes die (their sockets' FIN/RST must not reach peers)."""
        if self.host is not None and self.network is not None and self.host in self.network.hosts:
            self.host.cut()

    def _kill_guest(self, proc: subprocess.Popen) -> None:
        """Mechanical off: every process of this boot, in any process group."""
        self._cut()
        self._signal(proc, signal.SIGKILL)
        for pid in self._guest():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _wait_gone(self, proc: subprocess.Popen, timeout: float) -> bool:
        """Wait until every process of this boot has exited; True if they did within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            proc.poll()  # reap the leader, or the group never looks empty
            if proc.returncode is not None and not group_alive(proc.pid) and not self._guest():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _take_proc(self) -> subprocess.Popen | None:
        with self._lock:
            proc, self.proc = self.proc, None
            return proc

    def power_off(self, grace: float) -> bool:
        """ACPI soft off, then mechanical off after `grace` seconds. Returns True if the guest exited in time.
        The process is taken first, so a concurrent crash() or stop never signals a stale group."""
        clean = True
        with self._lock:
            proc = self.proc
        if proc is not None:
            self._signal(proc, signal.SIGTERM)
            clean = self._wait_gone(proc, grace)
            if self._take_proc() is proc:
                if not clean:
                    self._kill_guest(proc)
                    self._wait_gone(proc, 10)
                self.exit_codes.append(proc.returncode)
        self._cut()
        self.stop_metadata()
        return clean

    def crash(self) -> None:
        """Host error (or the sim stopping): everything dies at once."""
        self._cut()
        proc = self._take_proc()
        if proc is not None:
            self._kill_guest(proc)
            self._wait_gone(proc, 10)
            self.exit_codes.append(proc.returncode)
        self.stop_metadata()

    def stop_metadata(self) -> None:
        with self._lock:
            metadata, self.metadata = self.metadata, None
        if metadata is not None:
            metadata.stop()

    def destroy(self) -> None:
        """Delete: nothing of the node is left."""
        self.crash()
        if self.network is not None and self.host is not None:
            self.network.remove_host(self.host)
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.containers is not None:
            node_containers.forget(self.directory)
