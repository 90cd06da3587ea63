"""SimRuntime: what the sim's services share, and all they know of the sim around them.

SimServer builds one and hands it to each service (sim/compute.py, sim/tpu.py, sim/tpu_queued.py, sim/advice.py,
sim/storage_folders.py) in place of itself: the state lock, the sim clock and scheduler, the capacity and quota
timelines, the node records, the audit log, the operations' step (and the hold on a zone's), the node VMs' addresses
and runtimes, the settings the services read (a test may change one between calls: SimServer's attribute of the
same name is this object's), and the usage the capacity and quota checks count, summed over the services that
register theirs. No service imports sim.server (tests/test_sim_layers.py checks it).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from sim.capacity import Timeline
from sim.core import NodeAddresses, NodeRecord, Scheduler
from sim.netns import Host, Network
from sim.node_containers import NodeContainers
from sim.nodes import NodeRuntime

# what a service counts of its nodes: usage(zone or region, accelerator, model or None, by_region)
UsageCounter = Callable[[str, str, "str | None", bool], int]


class SimRuntime:
    def __init__(self, project: str, *, notice_seconds: float, op_delay: float, metadata_op_delay: float,
                 delete_grace: float, audit_timing: str, run_duration_scale: float, flex_start_insert: str,
                 tpu_endpoints: str, boot_command: list[str] | None, node_env: dict, nodes_root: Path | None,
                 audit_sink: Callable[[dict], None] | None, network_mode: str, metadata_servers: bool,
                 node_containers: NodeContainers | None) -> None:
        self.project = project
        self.notice_seconds = notice_seconds
        self.op_delay = op_delay
        self.metadata_op_delay = metadata_op_delay
        self.delete_grace = delete_grace
        self.audit_timing = audit_timing
        self.run_duration_scale = run_duration_scale
        self.flex_start_insert = flex_start_insert
        self.tpu_endpoints = tpu_endpoints
        self.boot_command = boot_command
        self.node_env = node_env
        self.node_containers = node_containers
        self.metadata_servers = metadata_servers
        self._own_root = nodes_root is None
        self.nodes_root = Path(nodes_root).resolve() if nodes_root is not None else None  # nodes run in their own cwd
        self.audit_sink = audit_sink
        self.network_mode = network_mode
        self.network: Network | None = None  # netns mode, from start() to stop()
        self.endpoint: str | None = None  # the sim's HTTP endpoint, while it serves
        self.cond = threading.Condition(threading.RLock())
        self.capacity = Timeline()
        self.quota = Timeline()
        self.records: list[NodeRecord] = []
        self.audit_log: list[dict] = []
        self.addresses = NodeAddresses()
        self.scheduler: Scheduler | None = None
        self._held: dict[str, list[tuple[float, Callable, tuple]]] = {}  # zone → its operations' steps waiting
        self._usage: list[UsageCounter] = []
        self._t0 = time.monotonic()

    def start(self) -> None:
        """The nodes' root, the network (netns mode), the scheduler; the clock starts again at 0."""
        if self._own_root:
            self.nodes_root = Path(tempfile.mkdtemp(prefix="respawn-sim-nodes-"))
        self.nodes_root.mkdir(parents=True, exist_ok=True)
        if self.network_mode == "netns":
            self.network = Network()
        self.scheduler = Scheduler()
        self._t0 = time.monotonic()

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    def close(self) -> None:
        """Remove what start() made, once every node's processes have ended."""
        if self.network is not None:  # every namespace, veth, relay and the bridge
            self.network.close()
            self.network = None
        if self._own_root and self.nodes_root is not None:
            shutil.rmtree(self.nodes_root, ignore_errors=True)

    def now(self) -> float:
        """Seconds on the sim clock (since start()); capacity timelines and node history use it."""
        return time.monotonic() - self._t0

    # --- audit events and operations --------------------------------------------------------------------------

    def emit(self, entry: dict) -> None:
        """Write one LogEntry: kept in `audit_log` and handed to the audit sink (never under the state lock)."""
        with self.cond:
            self.audit_log.append(entry)
        if self.audit_sink is not None:
            self.audit_sink(entry)

    def op_step(self, zone: str, delay: float, fn, *args) -> None:
        """The next step of a create or start operation in `zone` (a refusal's too), `delay` seconds from now, or
        when release(zone) lifts hold(zone)."""
        with self.cond:
            if zone in self._held:
                self._held[zone].append((delay, fn, args))
                return
        self.scheduler.call_later(delay, fn, *args)

    def hold(self, zone: str) -> None:
        with self.cond:
            self._held.setdefault(zone, [])

    def release(self, zone: str) -> None:
        """The held steps of `zone` go on, each its own delay from now."""
        with self.cond:
            steps = self._held.pop(zone, [])
        for delay, fn, args in steps:
            self.scheduler.call_later(delay, fn, *args)

    @staticmethod
    def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
        """Poll `predicate` until true; raises TimeoutError naming `what` (for tests and the demo)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"sim: {what} did not happen within {timeout} s")
            time.sleep(0.02)

    # --- capacity and quota in use ------------------------------------------------------------------------------

    def count_usage(self, counter: UsageCounter) -> None:
        """Count `counter`'s nodes in usage() (each service that holds capacity or quota registers its own)."""
        self._usage.append(counter)

    def usage(self, what: str, scope: str, accelerator: str, model: str | None) -> int:
        """Nodes holding "capacity" in zone `scope` or "quota" in region `scope` (`model`: one model's; None: all)."""
        by_region = what == "quota"
        return sum(counter(scope, accelerator, model, by_region) for counter in self._usage)

    # --- node VMs -------------------------------------------------------------------------------------------

    def new_hosts(self, name: str, count: int = 1, hostnames: list[str] | None = None) -> list[tuple[str, Host | None]]:
        """The address of each of a new node's `count` VMs (host 0 first), with its namespace in netns mode, where
        each VM's hostname (`hostnames[i]`; default the node's name) resolves to its address on every VM of the
        node, as a VPC's internal DNS resolves VM names."""
        if self.network is None:
            return [(a, None) for a in self.addresses.take(count)]
        names = hostnames or [name if count == 1 else f"{name}-w{i}" for i in range(count)]
        hosts = [self.network.add_host(n) for n in names]
        self.network.resolve_each_other(hosts)
        return [(h.address, h) for h in hosts]

    def node_runtime(self, kind: str, zone: str, name: str, metadata_kwargs: dict, *,
                     directory_name: str | None = None, host: Host | None = None) -> NodeRuntime:
        if self.endpoint is None:
            raise RuntimeError("the sim is not serving: call start() first")
        # Its agent writes Cloud Logging entries here (node_agent/cloudlog.py), as it would to logging.googleapis.com.
        env = {"RESPAWN_LOGGING_HOST": self.endpoint, **self.node_env}
        return NodeRuntime(directory=self.nodes_root / kind / zone / (directory_name or name), boot_command=self.boot_command,
                           node_env=env, metadata_kwargs=metadata_kwargs, network=self.network, host=host,
                           metadata_server=self.metadata_servers, containers=self.node_containers)


class OnRuntime:
    """A SimServer attribute that is its runtime's: read there, and written there, so that a setting a test changes
    between calls (op_delay, delete_grace, run_duration_scale, …) is the one the services read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, server: Any, owner: type | None = None):
        return self if server is None else getattr(server.runtime, self.name)

    def __set__(self, server: Any, value) -> None:
        setattr(server.runtime, self.name, value)


def on_runtime(count: int) -> tuple[OnRuntime, ...]:
    """`count` attributes that are the runtime's (their names: those they are assigned to in the class body)."""
    return tuple(OnRuntime() for _ in range(count))
