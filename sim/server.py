"""SimServer: a local Google Cloud for Compute Engine and Cloud TPU, on 127.0.0.1.

    with SimServer("respawn-test", notice_seconds=2, op_delay=0.05, boot_command=[...]) as sim:
        sim.endpoint            # "http://127.0.0.1:PORT": give it to the real clients as api_endpoint
        sim.set_capacity("us-central1-a", "nvidia-tesla-t4", 0)      # stock out now
        sim.set_capacity("us-central1-a", "nvidia-tesla-t4", None, at=30)  # recover 30 s into the run
        sim.preempt("us-central1-a", "job-1")

See sim/README.md for the whole surface, the HTTP control API and the Compute client's operation-polling catch.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Callable

from sim.advice import AdviceService
from sim.billing_catalog import BillingCatalog
from sim.compute import ComputeService
from sim.core import SimError
from sim.http_api import make_handler
from sim.loopback_http import LoopbackHTTPServer
from sim.metadata import MetadataServer
from sim.cloud_logging import CloudLogging, LogSink
from sim.cloud_scheduler import CloudScheduler
from sim.project import ProjectRecord
from sim.monitoring import Monitoring
from sim.node_containers import NodeContainers
from sim.runtime import SimRuntime, on_runtime
from sim.storage_folders import StorageFolders
from sim.tpu import ENDPOINT_FORMATS, ENDPOINTS_HOSTNAMES, TpuService

LABEL_JOB = "respawn-job"
CAPACITY_MODELS = ("SPOT", "STANDARD", "FLEX_START", "RESERVATION")  # RESERVATION: the zone's reservation (sim/compute_capacity.py)
QUOTA_MODELS = ("SPOT", "STANDARD")  # flex-start is charged to the preemptible ("SPOT") quota (gcp-facts §18)


def _check_model(model: str | None, allowed: tuple[str, ...], what: str) -> None:
    if model is not None and model not in allowed:
        hint = " (flex-start uses the preemptible quota: give 'SPOT')" if model == "FLEX_START" else ""
        raise ValueError(f"a {what} step's provisioning model must be one of {', '.join(allowed)} or None (all), "
                         f"not {model!r}{hint}")


class SimServer:
    # The runtime's state and settings (sim/runtime.py), as the server's own attributes: read and written there.
    project, cond, capacity, quota, records, audit_log, audit_sink, scheduler, addresses = on_runtime(9)
    notice_seconds, op_delay, metadata_op_delay, delete_grace, audit_timing, run_duration_scale = on_runtime(6)
    flex_start_insert, tpu_endpoints, boot_command, node_env, node_containers, metadata_servers = on_runtime(6)
    nodes_root, network, network_mode = on_runtime(3)

    def __init__(
        self,
        project: str,
        *,
        notice_seconds: float = 30,
        op_delay: float = 0.2,
        boot_command: list[str] | None = None,
        node_env: dict | None = None,
        nodes_root: Path | None = None,
        audit_sink: Callable[[dict], None] | None = None,
        port: int = 0,
        delete_grace: float | None = None,
        audit_timing: str = "end",
        seed: int = 0,
        metadata_op_delay: float | None = None,
        network: str = "loopback",
        metadata_servers: bool = True,
        tpu_endpoints: str = ENDPOINTS_HOSTNAMES,
        run_duration_scale: float = 1.0,
        flex_start_insert: str = "done",
        node_containers: NodeContainers | None = None,
    ) -> None:
        """
        notice_seconds: the preemption notice window (SIGTERM .. SIGKILL); 30 s on Google Cloud.
        op_delay: seconds per asynchronous lifecycle step (PROVISIONING -> STAGING -> RUNNING, CREATING -> READY).
        metadata_op_delay: seconds an instances.setMetadata operation takes (default: op_delay).
        boot_command: what the node's systemd unit runs (the node agent); None boots nodes with no process.
        node_env: extra environment for node processes (`{node_dir}` in a value: the node's directory).
        nodes_root: where node directories live (default: a temporary directory removed at stop()).
        audit_sink: called with every LogEntry dict the sim writes (e.g. an AuditRouter), through the deployment's
            Logging sink (`log_sink`, sim/cloud_logging.py: deleted or changed, it routes nothing).
        port: 0 = a free port.
        delete_grace: SIGTERM..SIGKILL grace on delete (default: min(notice_seconds, 5)).
        audit_timing: "end" writes a system event when the node is down (TERMINATED/PREEMPTED/deleted);
            "start" writes it when the preemption begins.
        network: "loopback" (default): a VM's address is a loopback one of this machine, its processes share the
            machine's network; "netns": every VM (TPU worker) runs in a network namespace of its own on a bridge
            (sim/netns.py; needs root): its address is its namespace's, its link goes down when it powers off,
            and partition() can cut it off from its peers alone.
        metadata_servers: False boots nodes with no metadata server (and so no boot_command): a node is then only
            its API resource, for benchmarks of thousands of nodes (each server is a thread and a port).
        tpu_endpoints: the format of a TPU worker's `worker-network-endpoints` (sim.tpu.ENDPOINT_FORMATS): the
            workers' hostnames (default, the newer format) or name:uid:IP triples (sim/tpu.py).
        run_duration_scale: wall seconds per second of a VM's scheduling.maxRunDuration and of a flex-start
            request's params.requestValidForDuration (0.01: a 600 s run ends after 6 s, and its
            terminationTimestamp says so); an attribute, so a test may change it before the insert.
        flex_start_insert: when the insert of a flex-start VM that waits for capacity (PENDING) ends: "done" at
            once, or "wait" when the VM runs or its request expires (ZONE_RESOURCE_POOL_EXHAUSTED). Which one
            Compute does is unverified (docs/gcp-facts.md §18).
        node_containers: every node gets a container runtime of its own (podman with runc, its storage on the
            node's disk, these registries over plain http: sim/node_containers.py); None: no configuration.
        """
        if not metadata_servers and boot_command:
            raise ValueError("metadata_servers=False boots no guest: it takes no boot_command")
        if network not in ("loopback", "netns"):
            raise ValueError(f"network must be 'loopback' or 'netns', not {network!r}")
        if tpu_endpoints not in ENDPOINT_FORMATS:
            raise ValueError(f"tpu_endpoints must be one of {ENDPOINT_FORMATS}, not {tpu_endpoints!r}")
        if flex_start_insert not in ("done", "wait"):
            raise ValueError(f"flex_start_insert must be 'done' or 'wait', not {flex_start_insert!r}")
        if not run_duration_scale > 0:
            raise ValueError(f"run_duration_scale must be > 0, not {run_duration_scale!r}")
        if audit_timing not in ("start", "end"):
            raise ValueError(f"audit_timing must be 'start' or 'end', not {audit_timing!r}")
        notice_seconds, op_delay = float(notice_seconds), float(op_delay)
        # The deployment's Logging sink (projects.sinks.*), in front of what plays its routing; none without one.
        self.log_sink = LogSink(project, audit_sink) if audit_sink is not None else None
        audit_sink = self.log_sink
        # What the services share of the sim, and all they know of it (sim/runtime.py): they hold no SimServer.
        self.runtime = SimRuntime(
            project, notice_seconds=notice_seconds, op_delay=op_delay,
            metadata_op_delay=op_delay if metadata_op_delay is None else float(metadata_op_delay),
            delete_grace=float(delete_grace) if delete_grace is not None else min(notice_seconds, 5.0),
            audit_timing=audit_timing, run_duration_scale=float(run_duration_scale),
            flex_start_insert=flex_start_insert, tpu_endpoints=tpu_endpoints,
            boot_command=list(boot_command) if boot_command else None, node_env=dict(node_env or {}),
            nodes_root=nodes_root, audit_sink=audit_sink, network_mode=network, metadata_servers=metadata_servers,
            node_containers=node_containers)
        self._port = port
        self.api_faults = {"rate": 0.0, "count": 0, "status": 503, "methods": (), "nodes": (), "after": False}
        self._rng = random.Random(seed)
        self.compute = ComputeService(self.runtime)
        self.tpu = TpuService(self.runtime)
        self.runtime.count_usage(self.compute.usage)
        self.runtime.count_usage(self.tpu.usage)
        self.storage_folders = StorageFolders()
        self.advice = AdviceService(self.runtime)
        self.monitoring = Monitoring()  # Cloud Monitoring's timeSeries.create: what the controller wrote
        # Cloud Logging's entries.write: what the node agents (and the self-test) wrote, routed through the sink
        self.cloud_logging = CloudLogging(sink=audit_sink)
        self.cloud_scheduler = CloudScheduler(project)  # the jobs this process's SweepSchedulers play
        # What the build made in the project: enabled APIs, service accounts, the IAM policy, the Slack secret
        self.project_record = ProjectRecord.as_built(project)
        self.catalog = BillingCatalog()  # Cloud Billing Catalog: service id → its SKUs (set_catalog)
        self._http: LoopbackHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> "SimServer":
        self.runtime.start()
        self._http = LoopbackHTTPServer(self._port, make_handler(self))
        self.runtime.endpoint = self.endpoint
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name="sim-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, then end every node's process group and metadata server."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._thread.join(timeout=5)
            self._http = None
            self.runtime.endpoint = None
        self.runtime.stop_scheduler()
        with self.cond:
            runtimes = [i.runtime for i in self.compute.instances.values()] + [
                r for n in self.tpu.nodes.values() for r in n.runtimes]
        for runtime in runtimes:
            runtime.crash()
        self.runtime.close()

    def __enter__(self) -> "SimServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self._http is None:
            raise RuntimeError("the sim is not serving: call start() first")
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    def now(self) -> float:
        """Seconds on the sim clock (since start()); capacity timelines and node history use it."""
        return self.runtime.now()

    # --- the HTTP API's faults --------------------------------------------------------------------------------

    def take_api_fault(self, method: str, node: str | None = None) -> bool:
        with self.cond:
            f = self.api_faults
            if method not in f["methods"] or (f["nodes"] and node not in f["nodes"]):
                return False
            if f["count"] > 0:
                f["count"] -= 1
                return True
            return f["rate"] > 0 and self._rng.random() < f["rate"]

    # --- control surface ------------------------------------------------------------------------------------

    def set_capacity(self, zone: str, accelerator_type: str, count: int | None = None, at: float | None = None,
                     provisioning_model: str | None = None) -> None:
        """From sim time `at` (default: now) on, at most `count` nodes of `accelerator_type` (a GPU type such as
        nvidia-tesla-t4, a machine type for VMs without GPUs, or a TPU type such as v5litepod-8) may hold
        hardware in `zone`; None = unlimited. `provisioning_model` "SPOT"/"STANDARD"/"FLEX_START" limits only that
        model (flex-start's capacity is a pool of its own: Spot may be 0 where flex-start is not)."""
        _check_model(provisioning_model, CAPACITY_MODELS, "capacity")
        self.capacity.set(zone, accelerator_type, count, self.now() if at is None else float(at), provisioning_model)

    def set_capacity_timeline(self, zone: str, accelerator_type: str, steps: list[tuple[float, int | None]],
                              provisioning_model: str | None = None) -> None:
        _check_model(provisioning_model, CAPACITY_MODELS, "capacity")
        for at, count in steps:
            self.capacity.set(zone, accelerator_type, count, float(at), provisioning_model)

    def set_reservation_end(self, zone: str, accelerator_type: str, ends_at: float) -> None:
        """The zone's reservation of `accelerator_type` (set_capacity(..., provisioning_model="RESERVATION")) is in
        calendar mode and ends at `ends_at` (wall clock, seconds since the epoch): sim/compute_capacity.py."""
        with self.cond:
            self.compute.checks.reservation_ends[(zone, accelerator_type)] = float(ends_at)

    def set_quota(self, region: str, accelerator_type: str, limit: int | None = None, at: float | None = None,
                  provisioning_model: str | None = None) -> None:
        """At most `limit` nodes of `accelerator_type` in `region` (e.g. us-central1); None = unlimited. A
        preempted TPU node counts until it is deleted; a TERMINATED VM does not. `provisioning_model` "SPOT" is the
        preemptible quota, which Spot, preemptible and flex-start VMs share; "STANDARD" the on-demand one."""
        _check_model(provisioning_model, QUOTA_MODELS, "quota")
        self.quota.set(region, accelerator_type, limit, self.now() if at is None else float(at), provisioning_model)

    def set_advice(self, zone: str, machine_type: str, **values) -> None:
        """Capacity advice for `machine_type` in `zone` (sim/advice.py, AdviceService.set): obtainability,
        estimated_uptime (s), preemption_rates and prices (USD) of the newest days; the rest follows the capacity
        timeline."""
        self.advice.set(zone, machine_type, **values)

    def set_catalog(self, service: str, skus: list[dict]) -> None:
        """The SKUs the Cloud Billing Catalog serves for `service` (e.g. respawn.prices.COMPUTE_SERVICE), in the
        documented shape (respawn.prices.catalog_skus makes them); none set: an empty list."""
        self.catalog.set(service, skus)

    def set_api_faults(self, rate: float = 0.0, count: int = 0, status: int = 503,
                       methods: tuple[str, ...] = ("insert", "create"), nodes: tuple[str, ...] = (),
                       after: bool = False) -> None:
        """Answer API calls with HTTP `status` itself (not inside an operation): the next `count` calls, then a
        `rate` fraction. methods: insert, delete, start, stop, get, list (Compute); create, delete, get, list (TPU).
        `nodes`: only calls about these node names. `after`: the call is carried out first and its answer lost (the
        caller sees the error, the node exists): a controller that dies right after its call."""
        with self.cond:
            self.api_faults = {"rate": rate, "count": count, "status": status, "methods": tuple(methods),
                               "nodes": tuple(nodes), "after": after}

    def hold_operations(self, zone: str) -> None:
        """Create and start operations in `zone` (Compute and TPU) stop where they are: the node stays PROVISIONING
        or CREATING and the operation pending, as a slow create does, until release_operations(zone)."""
        self.runtime.hold(zone)

    def release_operations(self, zone: str) -> None:
        """Let the held operations of `zone` go on, each step its own delay from now."""
        self.runtime.release(zone)

    def _kind(self, zone: str, name: str) -> str:
        with self.cond:
            if (zone, name) in self.compute.instances:
                return "instance"
            if (zone, name) in self.tpu.nodes:
                return "tpu"
        raise SimError(f"no instance or TPU node named {name!r} in zone {zone}")

    def preempt(self, zone: str, name: str) -> None:
        """Preemption: instance/preempted=TRUE, SIGTERM to the node's processes (the soft-off: at once, or after
        the instance's scheduling.preemptionNoticeDuration), SIGKILL notice_seconds after the soft-off, then
        TERMINATED (termination action STOP), deleted (DELETE), or PREEMPTED (TPU); audit entries follow.
        A FLEX_START VM is never preempted: SimError."""
        if self._kind(zone, name) == "instance":
            self.compute.events.preempt(zone, name)
        else:
            self.tpu.preempt(zone, name)

    def host_error(self, zone: str, name: str) -> None:
        """compute.instances.hostError: the node's processes die at once; the instance is TERMINATED (or
        restarted, for a non-Spot instance with automaticRestart)."""
        if self._kind(zone, name) != "instance":
            raise SimError(f"host_error applies to Compute instances; {zone}/{name} is a TPU node: use preempt()")
        self.compute.events.host_error(zone, name)

    def partition(self, zone: str, name: str, heal: bool = False) -> None:
        """Cut the node (every worker of a TPU slice) off from every other node while it keeps running and
        reaching the sim's services (its metadata server, the relayed emulators); `heal=True` undoes it.
        netns mode only."""
        if self.network is None:
            raise SimError("partition needs the sim's network='netns' (nodes on loopback share one network)")
        with self.cond:
            if self._kind(zone, name) == "instance":
                runtimes = [self.compute.instances[(zone, name)].runtime]
            else:
                runtimes = list(self.tpu.nodes[(zone, name)].runtimes)
        for runtime in runtimes:
            if runtime.host is not None:
                (self.network.heal if heal else self.network.partition)(runtime.host)

    def maintenance_event(self, zone: str, name: str, value: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        if self._kind(zone, name) == "instance":
            self.compute.events.maintenance_event(zone, name, value)
        else:
            self.tpu.maintenance_event(zone, name, value)

    # --- observation ----------------------------------------------------------------------------------------

    def instances(self) -> list[dict]:
        """Every existing Compute instance and TPU node: kind, zone, name, status, labels, attributes, node dir,
        metadata host, process id and the service account it runs as."""
        with self.cond:
            return self.compute.snapshots() + self.tpu.snapshots()

    def live_nodes(self, job: str | None = None, label: str = LABEL_JOB) -> list[dict]:
        """Nodes holding hardware now (PROVISIONING..STOPPING, CREATING/READY/DELETING), optionally of one job."""
        return [r for r in self.history()
                if r["live"] and r["live"][-1][1] is None and (job is None or r["labels"].get(label) == job)]

    def history(self) -> list[dict]:
        """Every node that ever existed, with its state changes and live periods (sim-clock seconds)."""
        with self.cond:
            return [r.as_dict() for r in self.records]

    def max_live(self, job: str | None = None, label: str = LABEL_JOB) -> int:
        """The largest number of nodes (of one job, by label) that were ever live at the same moment."""
        return _max_overlap(self.history(), job, label)

    def queued_resources(self, job: str | None = None, label: str = LABEL_JOB) -> list[dict]:
        """Every Cloud TPU queued resource that exists now (any state: each holds quota), optionally of one job (by
        its node's label): zone, name, state, stateInitiator, nodeId, labels."""
        with self.cond:
            out = self.tpu.queued.snapshots()
        return [q for q in out if job is None or q["labels"].get(label) == job]

    def request_history(self) -> list[dict]:
        """Every queued resource that ever existed, as history() lists nodes (live: while it existed)."""
        with self.cond:
            return [r.as_dict() for r in self.tpu.queued.records]

    def max_requests(self, job: str | None = None, label: str = LABEL_JOB) -> int:
        """The largest number of queued resources (of one job) that existed at the same moment."""
        return _max_overlap(self.request_history(), job, label)

    def node_dir(self, zone: str, name: str, worker: int = 0) -> Path:
        """The node's disk; for a multi-host TPU node, worker `worker`'s (worker 0's is the node's)."""
        if self._kind(zone, name) == "instance":
            return self.nodes_root / "compute" / zone / name
        return self.tpu.worker_runtime(zone, name, worker).directory

    def metadata_server(self, zone: str, name: str, worker: int = 0) -> MetadataServer | None:
        """The running node's metadata server (None while it is not running); a TPU node's worker `worker`'s."""
        with self.cond:
            node = self.compute.instances.get((zone, name))
            if node is not None:
                return node.runtime.metadata
            return self.tpu.worker_runtime(zone, name, worker).metadata

    wait_for = staticmethod(SimRuntime.wait_for)  # poll a predicate until true (for tests and the demo)

    def status_of(self, zone: str, name: str) -> str | None:
        """The current status/state of an instance or TPU node; None if it does not exist."""
        with self.cond:
            if (zone, name) in self.compute.instances:
                return self.compute.instances[(zone, name)].status
            if (zone, name) in self.tpu.nodes:
                return self.tpu.nodes[(zone, name)].state
            return None


def _max_overlap(records: list[dict], job: str | None, label: str) -> int:
    """The most of `records` (of one job, by label) live at one moment."""
    points = []
    for r in records:
        if job is not None and r["labels"].get(label) != job:
            continue
        for start, end in r["live"]:
            points.append((start, 1))
            points.append((end if end is not None else float("inf"), -1))
    best = current = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts at the same instant
        current += delta
        best = max(best, current)
    return best
