"""The Cloud TPU v2 subset: nodes and google.longrunning operations.

Node state: CREATING -> READY (create), READY -> PREEMPTED (preemption; the node keeps holding quota until it is
deleted), any -> DELETING -> gone (delete). A capacity refusal ends the create operation with code 8
(RESOURCE_EXHAUSTED) and the real message 'There is no more capacity in the zone "Z"; ...'; the node never exists.
A node has `respawn.topology.tpu_hosts(acceleratorType)` worker VMs (v5litepod-16: 4), named like the real ones,
`t1v-n-<hash>-w-<i>`. Each worker is its own sim node runtime: its own disk (worker 0's is the node's directory,
worker i's `<node>.w<i>` beside it), its own metadata server serving the node's `metadata` map as
`instance/attributes/*` plus what Cloud TPU adds per worker, one or many (`agent-worker-number`,
`worker-network-endpoints`, `accelerator-type`), and, where the sim boots nodes, its own startup-script process. The
API's node lists one `networkEndpoints` entry per worker, worker 0 first.

`worker-network-endpoints` comes in the format `SimServer(tpu_endpoints=…)` names (gcp-facts §13): the workers'
hostnames, which are their VM names (in netns mode every worker's /etc/hosts resolves its slice's names to their
addresses, sim/netns.py; on loopback, where a name cannot be made to resolve, the hostname format lists the workers'
addresses), or `name:uid:IP` triples (the VM name, its numeric id, its address). The node lives and dies as a unit: a preemption flags every
worker's metadata server and powers every worker off (each agent gets its notice), then the node is PREEMPTED; a
delete removes every worker.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
from dataclasses import dataclass, field

from respawn import contract
from respawn.topology import tpu_hosts
from sim.core import MAX_HOSTS
from sim import audit_entries
from sim.capacity import region_of
from sim.core import NodeRecord, SimError, found, rfc3339, rpc_error
from sim.nodes import NodeRuntime
from sim.runtime import SimRuntime
from sim.tpu_queued import QueuedResources

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LIVE = ("CREATING", "READY", "DELETING")
# The two formats of contract.ATTR_WORKER_ENDPOINTS Cloud TPU serves (gcp-facts §13): each entry a worker's hostname,
# or, in the older format, a name:uid:IP triple whose third field is the address.
ENDPOINTS_HOSTNAMES = "hostnames"
ENDPOINTS_TRIPLES = "triples"
ENDPOINT_FORMATS = (ENDPOINTS_HOSTNAMES, ENDPOINTS_TRIPLES)


def format_worker_endpoints(workers: list[tuple[str, str, str]], fmt: str) -> str:
    """The worker-network-endpoints value for `workers`, (hostname, uid, IP) each, worker 0 first, in `fmt` (one of
    ENDPOINT_FORMATS)."""
    if fmt == ENDPOINTS_HOSTNAMES:
        return ",".join(name for name, _, _ in workers)
    if fmt == ENDPOINTS_TRIPLES:
        return ",".join(f"{name}:{uid}:{ip}" for name, uid, ip in workers)
    raise ValueError(f"worker endpoint format must be one of {', '.join(ENDPOINT_FORMATS)}, got {fmt!r}")
NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
ENDPOINT_PORT = 8470  # what the real API lists for every worker


def worker_name(project: str, zone: str, node: str, worker: int = 0) -> str:
    digest = hashlib.sha1(f"{project}/{zone}/{node}".encode()).hexdigest()[:8]
    return f"t1v-n-{digest}-w-{worker}"


@dataclass
class Node:
    zone: str
    name: str
    body: dict
    record: NodeRecord
    runtimes: list[NodeRuntime]  # one per worker VM, worker 0 first
    accelerator: str
    model: str
    workers: list[str]  # the worker VMs' names (t1v-n-<hash>-w-<i>)
    worker_ids: list[str]
    addresses: list[str]  # the worker VMs' IPs (sim.core.NodeAddresses)
    gen: int = 0
    shutdown: threading.Thread | None = None
    request: str | None = None  # the queued resource that made it (Node.queued_resource); None: created directly

    @property
    def state(self) -> str:
        return self.body["state"]

    @property
    def runtime(self) -> NodeRuntime:
        """Worker 0's: the node's own for a single-host node."""
        return self.runtimes[0]

    @property
    def worker(self) -> str:
        return self.workers[0]

    @property
    def worker_id(self) -> str:
        return self.worker_ids[0]


def _each(runtimes: list[NodeRuntime], action, *args) -> None:
    """Do `action(runtime, *args)` to every worker at once (a slice loses power as a whole, not worker by worker)."""
    if len(runtimes) == 1:
        action(runtimes[0], *args)
        return
    threads = [threading.Thread(target=action, args=(r, *args), daemon=True) for r in runtimes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass
class Operation:
    body: dict
    done: threading.Event = field(default_factory=threading.Event)


class TpuService:
    def __init__(self, rt: SimRuntime) -> None:
        self.rt = rt
        self.nodes: dict[tuple[str, str], Node] = {}
        self.operations: dict[str, Operation] = {}
        self._ids = random.Random(2)
        self.queued = QueuedResources(rt, self)

    def _path(self, zone: str, name: str) -> str:
        return f"projects/{self.rt.project}/locations/{zone}/nodes/{name}"

    def _get(self, zone: str, name: str) -> Node:
        return found(self.nodes, zone, name, self._path(zone, name))

    def new_op(self, zone: str, verb: str, target: str) -> Operation:
        name = f"projects/{self.rt.project}/locations/{zone}/operations/operation-{int(time.time() * 1000)}-{self._ids.getrandbits(48):012x}"
        op = Operation({"name": name, "done": False, "metadata": {
            "@type": METADATA_TYPE, "createTime": rfc3339(), "target": target, "verb": verb, "apiVersion": "v2"}})
        self.operations[name] = op
        return op

    def finish(self, op: Operation | None, *, response: dict | None = None, error: dict | None = None) -> None:
        if op is None:  # a queued resource's node: its request has no operation of its own for it
            return
        with self.rt.cond:
            op.body["done"] = True
            op.body["metadata"]["endTime"] = rfc3339()
            if error is not None:
                op.body["error"] = error
            else:
                op.body["response"] = response or {"@type": "type.googleapis.com/google.protobuf.Empty"}
            op.done.set()
            self.rt.cond.notify_all()

    def _set_state(self, node: Node, state: str) -> None:
        # Deleting holds what the node held: nothing after PREEMPTED or STOPPED, and a second delete changes nothing.
        held = bool(node.record.live) and node.record.live[-1][1] is None
        live = held if state == "DELETING" else state in LIVE
        node.body["state"] = state
        node.gen += 1
        node.record.transition(self.rt.now(), state, live)

    def _refusal(self, zone: str, accelerator: str, model: str) -> dict | None:
        return self.quota_refusal(zone, accelerator, model) or self.capacity_refusal(zone, accelerator, model)

    def quota_refusal(self, zone: str, accelerator: str, model: str) -> dict | None:
        """The operation error of a create that would go past the region's quota (None: within it)."""
        region = region_of(zone)
        limit, specific = self.rt.quota.limit(region, accelerator, model, self.rt.now())
        if limit is not None and self.rt.usage("quota", region, accelerator, model if specific else None) + 1 > limit:
            kind = "Preemptible" if model == "SPOT" else ""
            return {"code": 8, "message": f"Quota 'TPU{kind}PerProjectPerRegionForTPUAPI' exhausted. "
                                          f"Limit {limit} in region {region}"}
        return None

    def capacity_refusal(self, zone: str, accelerator: str, model: str) -> dict | None:
        """The operation error of a create the zone has no hardware for now (None: it has)."""
        limit, specific = self.rt.capacity.limit(zone, accelerator, model, self.rt.now())
        if limit is not None and self.rt.usage("capacity", zone, accelerator, model if specific else None) + 1 > limit:
            eid = f"0x{self._ids.getrandbits(64):016x}"
            return {"code": 8, "message": f'There is no more capacity in the zone "{zone}"; you can try in another '
                                          "zone where Cloud TPU Nodes are offered (see "
                                          f"https://cloud.google.com/tpu/docs/regions) [EID: {eid}]"}
        return None

    # --- API ------------------------------------------------------------------------------------------------

    def validate(self, node_id: str, body: dict) -> tuple[str, int]:
        """A node body's accelerator type and worker count, or 400 as Cloud TPU answers a bad node."""
        if not NAME_RE.match(node_id or ""):
            raise rpc_error(400, f"Invalid node id '{node_id}': it must match [a-z]([-a-z0-9]*[a-z0-9])?")
        accelerator = body.get("acceleratorType") or "-".join(
            filter(None, [(body.get("acceleratorConfig") or {}).get("type"), (body.get("acceleratorConfig") or {}).get("topology")]))
        if not accelerator:
            raise rpc_error(400, "Invalid node: acceleratorType or acceleratorConfig is required")
        try:
            hosts = tpu_hosts(accelerator)
        except ValueError as exc:
            if body.get("acceleratorType"):
                raise rpc_error(400, f"Invalid node: {exc}") from None
            hosts = 1  # acceleratorConfig (type + topology): not sized by the sim; one worker
        if hosts > MAX_HOSTS:
            raise rpc_error(400, f"Invalid node: {accelerator} has {hosts} workers; the sim runs at most {MAX_HOSTS}")
        if not body.get("runtimeVersion"):
            raise rpc_error(400, "Invalid node: runtime_version is required")
        return accelerator, hosts

    def create(self, zone: str, node_id: str, body: dict) -> dict:
        accelerator, hosts = self.validate(node_id, body)
        with self.rt.cond:
            if (zone, node_id) in self.nodes:
                raise rpc_error(409, f"Resource '{self._path(zone, node_id)}' already exists")
            sched = body.get("schedulingConfig") or {}
            model = "SPOT" if sched.get("spot") or sched.get("preemptible") else "STANDARD"
            op = self.new_op(zone, "create", self._path(zone, node_id))
            refusal = self._refusal(zone, accelerator, model)
            if refusal:
                self.rt.op_step(zone, self.rt.op_delay, lambda: self.finish(op, error=refusal))
                return dict(op.body)
            self.make_node(zone, node_id, body, accelerator, hosts, model, op)
        self.rt.emit(audit_entries.activity("google.cloud.tpu.v2.Tpu.CreateNode", project=self.rt.project,
                                            resource_name=self._path(zone, node_id), service="tpu.googleapis.com"))
        return dict(op.body)

    def make_node(self, zone: str, node_id: str, body: dict, accelerator: str, hosts: int, model: str,
                  op: Operation | None, request: str | None = None) -> Node:
        """Make the node (under the lock): CREATING, READY 2 x op_delay later. `request`: the queued resource that
        made it (its full name, Node.queued_resource), told when the node is READY."""
        resource = dict(body)
        node_numeric_id = str(self._ids.randrange(10**17, 2**63))  # Node.id is an int64
        resource.update({
            "name": self._path(zone, node_id), "acceleratorType": accelerator, "state": "CREATING",
            "createTime": rfc3339(), "id": node_numeric_id, "apiVersion": "V2",
            "labels": dict(body.get("labels") or {}), "metadata": dict(body.get("metadata") or {}),
            "health": "HEALTHY",
        })
        if request is not None:
            resource["queuedResource"] = request
        workers = [worker_name(self.rt.project, zone, node_id, w) for w in range(hosts)]
        worker_ids = [str(self._ids.randrange(10**18, 10**19)) for _ in range(hosts)]
        addresses, vms = map(list, zip(*self.rt.new_hosts(node_id, hosts, workers)))
        fmt = self.rt.tpu_endpoints
        names = workers if self.rt.network is not None or fmt == ENDPOINTS_TRIPLES else addresses
        endpoints = format_worker_endpoints(list(zip(names, worker_ids, addresses)), fmt)
        record = NodeRecord("tpu", zone, node_id, dict(resource["labels"]), accelerator, model, self.rt.now())
        runtimes = []
        for w in range(hosts):
            # What Cloud TPU adds to each worker VM's metadata, a single host's too (worker 0 of one endpoint).
            attributes = dict(resource["metadata"])
            attributes.update({contract.ATTR_ACCELERATOR_TYPE: accelerator, contract.ATTR_WORKER_NUMBER: str(w),
                               contract.ATTR_WORKER_ENDPOINTS: endpoints})
            runtimes.append(self.rt.node_runtime("tpu", zone, node_id, {
                "name": workers[w], "zone": zone, "project": self.rt.project, "instance_id": worker_ids[w],
                "machine_type": "tpu-vm", "attributes": attributes}, directory_name=_worker_dir(node_id, w), host=vms[w]))
        node = Node(zone, node_id, resource, record, runtimes, accelerator, model, workers, worker_ids, addresses,
                    request=request)
        self.nodes[(zone, node_id)] = node
        self.rt.records.append(record)
        self._set_state(node, "CREATING")
        self.rt.op_step(zone, self.rt.op_delay * 2, self._to_ready, node, node.gen, op)
        return node

    def _to_ready(self, node: Node, gen: int, op: Operation | None) -> None:
        with self.rt.cond:
            if node.gen != gen or self.nodes.get((node.zone, node.name)) is not node:
                self.finish(op, error={"code": 10, "message": "The node was deleted while it was being created"})
                return
            self._set_state(node, "READY")
            node.body["networkEndpoints"] = [{"ipAddress": ip, "port": ENDPOINT_PORT} for ip in node.addresses]
            node.record.boots += 1
            for runtime in node.runtimes:
                runtime.boot()
            response = {"@type": NODE_TYPE, **node.body}
            if node.request is not None:
                self.queued.node_ready(node)
        self.finish(op, response=response)

    def get(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            return dict(self._get(zone, name).body)

    def update(self, zone: str, name: str, body: dict, mask: str) -> dict:
        """nodes.patch with updateMask=metadata (the one field the sim updates): the node's metadata becomes the
        body's, and every worker's metadata server serves it at once (a worker not booted yet gets it at boot)."""
        fields = {f.strip() for f in mask.split(",") if f.strip()}
        if fields != {"metadata"}:
            raise rpc_error(400, f"Invalid update mask {mask!r}: the sim updates metadata only")
        with self.rt.cond:
            node = self._get(zone, name)
            before, after = dict(node.body.get("metadata") or {}), dict(body.get("metadata") or {})
            node.body["metadata"] = after
            for runtime in node.runtimes:  # each keeps what Cloud TPU adds (worker number, endpoints)
                runtime.set_attributes(before.keys() - after.keys(), after)
            op = self.new_op(zone, "update", self._path(zone, name))
            self.rt.op_step(zone, self.rt.op_delay, lambda: self.finish(op, response={"@type": NODE_TYPE,
                                                                                      **node.body}))
        return dict(op.body)

    def list(self, zone: str) -> dict:
        with self.rt.cond:
            return {"nodes": [dict(n.body) for (z, _), n in sorted(self.nodes.items()) if z == zone]}

    def delete(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            node = self._get(zone, name)
            op = self.new_op(zone, "delete", self._path(zone, name))
            self._set_state(node, "DELETING")
            pending = node.shutdown
            threading.Thread(target=self._delete, args=(node, op, pending), name=f"tpu-delete-{name}", daemon=True).start()
        self.rt.emit(audit_entries.activity("google.cloud.tpu.v2.Tpu.DeleteNode", project=self.rt.project,
                                            resource_name=self._path(zone, name), service="tpu.googleapis.com"))
        return dict(op.body)

    def _delete(self, node: Node, op: Operation, pending: threading.Thread | None) -> None:
        if pending is not None:
            pending.join()
        _each(node.runtimes, NodeRuntime.power_off, self.rt.delete_grace)
        _each(node.runtimes, NodeRuntime.destroy)
        time.sleep(self.rt.op_delay)
        with self.rt.cond:
            if self.nodes.get((node.zone, node.name)) is node:
                del self.nodes[(node.zone, node.name)]
                node.gen += 1
                node.record.deleted(self.rt.now())
                if node.request is not None:
                    self.queued.node_deleted(node)
        self.finish(op)

    def get_operation(self, name: str) -> dict:
        with self.rt.cond:
            op = self.operations.get(name)
            if op is None:
                raise rpc_error(404, f"Operation '{name}' was not found")
            return dict(op.body)

    # --- system events ----------------------------------------------------------------------------------------

    def preempt(self, zone: str, name: str, reason: str = "PREEMPTED") -> None:
        with self.rt.cond:
            node = self.nodes.get((zone, name))
            if node is None or node.state not in ("CREATING", "READY"):
                raise SimError(f"cannot preempt TPU node {zone}/{name}: it is "
                               f"{'absent' if node is None else node.state}; only a CREATING or READY node can be preempted")
            for runtime in node.runtimes:  # every worker is told: the slice goes as a whole
                if runtime.metadata is not None:
                    runtime.metadata.set("instance/preempted", "TRUE")
            gen = node.gen
            # One tpu.nodes.terminate for the node, one compute.instances.preempted per worker VM (as on Google Cloud).
            entries = [
                audit_entries.tpu_node_terminate(project=self.rt.project, zone=zone, node_name=name, reason=reason),
                *(audit_entries.compute_system_event("compute.instances.preempted", project=self.rt.project,
                                                     zone=zone, instance_name=w, instance_id=i)
                  for w, i in zip(node.workers, node.worker_ids)),
            ]
            early = self.rt.audit_timing == "start"
        if early:
            for e in entries:
                self.rt.emit(e)

        def run():
            _each(node.runtimes, NodeRuntime.power_off, self.rt.notice_seconds)
            with self.rt.cond:
                if self.nodes.get((zone, name)) is node and node.gen == gen:
                    self._set_state(node, "PREEMPTED")
                    node.body.pop("networkEndpoints", None)
                node.shutdown = None
                if node.request is not None and node.state == "PREEMPTED":
                    self.queued.node_preempted(node)
            if not early:
                for e in entries:
                    self.rt.emit(e)

        node.shutdown = threading.Thread(target=run, name=f"tpu-preempt-{name}", daemon=True)
        node.shutdown.start()

    def maintenance_event(self, zone: str, name: str, value: str) -> None:
        with self.rt.cond:
            node = self.nodes.get((zone, name))
            if node is None or node.runtime.metadata is None:
                raise SimError(f"TPU node {zone}/{name} is not running, so it has no metadata server to notify")
            for runtime in node.runtimes:
                if runtime.metadata is not None:
                    runtime.metadata.set("instance/maintenance-event", value)
            if value != "NONE":
                node.body["health"] = "UNHEALTHY_MAINTENANCE"

    def snapshots(self) -> list[dict]:
        """Every node, as SimServer.instances() lists it (under the lock)."""
        out = []
        for n in self.nodes.values():
            snap = n.runtime.snapshot("tpu", n.zone, n.name, n.state, n.body.get("labels", {}),
                                      dict(n.body.get("metadata", {})))
            snap["service_account"] = (n.body.get("serviceAccount") or {}).get("email")
            # The top-level fields are worker 0's; every worker VM of the slice, worker 0 first:
            snap["workers"] = [{**r.snapshot("worker", n.zone, w, n.state, {}, {}), "worker": i, "ipAddress": ip}
                               for i, (w, r, ip) in enumerate(zip(n.workers, n.runtimes, n.addresses))]
            out.append(snap)
        return out

    def worker_runtime(self, zone: str, name: str, worker: int) -> NodeRuntime:
        """Worker `worker`'s runtime of node `name` (SimError when there is no such node or worker)."""
        with self.rt.cond:
            node = self.nodes.get((zone, name))
            if node is None:
                raise SimError(f"no instance or TPU node named {name!r} in zone {zone}")
            if not 0 <= worker < len(node.runtimes):
                raise SimError(f"TPU node {zone}/{name} has {len(node.runtimes)} worker(s); there is no worker {worker}")
            return node.runtimes[worker]

    def usage(self, scope: str, accelerator: str, model: str | None, by_region: bool) -> int:
        # a PREEMPTED node no longer holds hardware, but it holds quota until deleted; a queued resource's node is
        # counted in quota as its request (which holds it in every state: sim/tpu_queued.py)
        states = ("CREATING", "READY", "DELETING", "PREEMPTED") if by_region else LIVE
        nodes = sum(
            1 for n in self.nodes.values()
            if (region_of(n.zone) if by_region else n.zone) == scope and not (by_region and n.request)
            and n.accelerator == accelerator and (model is None or n.model == model) and n.state in states
        )
        return nodes + (self.queued.usage(scope, accelerator, model) if by_region else 0)


def _worker_dir(node: str, worker: int) -> str:
    """Worker 0's disk is the node's directory (as for a single-host node); worker i's sits beside it. A dot cannot
    occur in a node name, so no node's directory is ever another node's worker's."""
    return node if worker == 0 else f"{node}.w{worker}"


__all__ = ["TpuService", "worker_name"]
