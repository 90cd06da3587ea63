"""The Cloud TPU v2 subset: nodes and google.longrunning operations.

Node state: CREATING -> READY (create), READY -> PREEMPTED (preemption; the node keeps holding quota until it is
deleted), any -> DELETING -> gone (delete). A capacity refusal ends the create operation with code 8
(RESOURCE_EXHAUSTED) and the real message 'There is no more capacity in the zone "Z"; ...'; the node never exists.
A node's single worker VM is named like the real ones, `t1v-n-<hash>-w-0`; its metadata server serves the node's
`metadata` map as `instance/attributes/*`.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim import audit_entries
from sim.capacity import region_of
from sim.core import NodeRecord, SimError, rfc3339, rpc_error
from sim.nodes import NodeRuntime

if TYPE_CHECKING:
    from sim.server import SimServer

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LIVE = ("CREATING", "READY", "DELETING")
NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"


def worker_name(project: str, zone: str, node: str) -> str:
    digest = hashlib.sha1(f"{project}/{zone}/{node}".encode()).hexdigest()[:8]
    return f"t1v-n-{digest}-w-0"


@dataclass
class Node:
    zone: str
    name: str
    body: dict
    record: NodeRecord
    runtime: NodeRuntime
    accelerator: str
    model: str
    worker: str
    worker_id: str
    gen: int = 0
    shutdown: threading.Thread | None = None

    @property
    def state(self) -> str:
        return self.body["state"]


@dataclass
class Operation:
    body: dict
    done: threading.Event = field(default_factory=threading.Event)


class TpuService:
    def __init__(self, sim: "SimServer") -> None:
        self.sim = sim
        self.nodes: dict[tuple[str, str], Node] = {}
        self.operations: dict[str, Operation] = {}
        self._ids = random.Random(2)

    def _path(self, zone: str, name: str) -> str:
        return f"projects/{self.sim.project}/locations/{zone}/nodes/{name}"

    def _get(self, zone: str, name: str) -> Node:
        node = self.nodes.get((zone, name))
        if node is None:
            raise rpc_error(404, f"Resource '{self._path(zone, name)}' was not found")
        return node

    def _new_op(self, zone: str, verb: str, target: str) -> Operation:
        name = f"projects/{self.sim.project}/locations/{zone}/operations/operation-{int(time.time() * 1000)}-{self._ids.getrandbits(48):012x}"
        op = Operation({"name": name, "done": False, "metadata": {
            "@type": METADATA_TYPE, "createTime": rfc3339(), "target": target, "verb": verb, "apiVersion": "v2"}})
        self.operations[name] = op
        return op

    def _finish(self, op: Operation, *, response: dict | None = None, error: dict | None = None) -> None:
        with self.sim.cond:
            op.body["done"] = True
            op.body["metadata"]["endTime"] = rfc3339()
            if error is not None:
                op.body["error"] = error
            else:
                op.body["response"] = response or {"@type": "type.googleapis.com/google.protobuf.Empty"}
            op.done.set()
            self.sim.cond.notify_all()

    def _set_state(self, node: Node, state: str) -> None:
        node.body["state"] = state
        node.gen += 1
        node.record.transition(self.sim.now(), state, state in LIVE)

    def _refusal(self, zone: str, accelerator: str, model: str) -> dict | None:
        t = self.sim.now()
        region = region_of(zone)
        limit, specific = self.sim.quota.limit(region, accelerator, model, t)
        if limit is not None and self.sim.usage("quota", region, accelerator, model if specific else None) + 1 > limit:
            kind = "Preemptible" if model == "SPOT" else ""
            return {"code": 8, "message": f"Quota 'TPU{kind}PerProjectPerRegionForTPUAPI' exhausted. "
                                          f"Limit {limit} in region {region}"}
        limit, specific = self.sim.capacity.limit(zone, accelerator, model, t)
        if limit is not None and self.sim.usage("capacity", zone, accelerator, model if specific else None) + 1 > limit:
            eid = f"0x{self._ids.getrandbits(64):016x}"
            return {"code": 8, "message": f'There is no more capacity in the zone "{zone}"; you can try in another '
                                          "zone where Cloud TPU Nodes are offered (see "
                                          f"https://cloud.google.com/tpu/docs/regions) [EID: {eid}]"}
        return None

    # --- API ------------------------------------------------------------------------------------------------

    def create(self, zone: str, node_id: str, body: dict) -> dict:
        if not NAME_RE.match(node_id or ""):
            raise rpc_error(400, f"Invalid node id '{node_id}': it must match [a-z]([-a-z0-9]*[a-z0-9])?")
        accelerator = body.get("acceleratorType") or "-".join(
            filter(None, [(body.get("acceleratorConfig") or {}).get("type"), (body.get("acceleratorConfig") or {}).get("topology")]))
        if not accelerator:
            raise rpc_error(400, "Invalid node: acceleratorType or acceleratorConfig is required")
        if not body.get("runtimeVersion"):
            raise rpc_error(400, "Invalid node: runtime_version is required")
        with self.sim.cond:
            if (zone, node_id) in self.nodes:
                raise rpc_error(409, f"Resource '{self._path(zone, node_id)}' already exists")
            sched = body.get("schedulingConfig") or {}
            model = "SPOT" if sched.get("spot") or sched.get("preemptible") else "STANDARD"
            op = self._new_op(zone, "create", self._path(zone, node_id))
            refusal = self._refusal(zone, accelerator, model)
            if refusal:
                self.sim.scheduler.call_later(self.sim.op_delay, lambda: self._finish(op, error=refusal))
                return dict(op.body)
            resource = dict(body)
            node_numeric_id = str(self._ids.randrange(10**18, 10**19))
            resource.update({
                "name": self._path(zone, node_id), "acceleratorType": accelerator, "state": "CREATING",
                "createTime": rfc3339(), "id": node_numeric_id, "apiVersion": "V2",
                "labels": dict(body.get("labels") or {}), "metadata": dict(body.get("metadata") or {}),
                "health": "HEALTHY",
            })
            worker = worker_name(self.sim.project, zone, node_id)
            worker_id = str(self._ids.randrange(10**18, 10**19))
            record = NodeRecord("tpu", zone, node_id, dict(resource["labels"]), accelerator, model, self.sim.now())
            runtime = self.sim.make_runtime("tpu", zone, node_id, {
                "name": worker, "zone": zone, "project": self.sim.project, "instance_id": worker_id,
                "machine_type": "tpu-vm", "attributes": dict(resource["metadata"])})
            node = Node(zone, node_id, resource, record, runtime, accelerator, model, worker, worker_id)
            self.nodes[(zone, node_id)] = node
            self.sim.records.append(record)
            self._set_state(node, "CREATING")
            self.sim.scheduler.call_later(self.sim.op_delay * 2, self._to_ready, node, node.gen, op)
        self.sim.emit(audit_entries.activity("google.cloud.tpu.v2.Tpu.CreateNode", project=self.sim.project,
                                             resource_name=self._path(zone, node_id), service="tpu.googleapis.com"))
        return dict(op.body)

    def _to_ready(self, node: Node, gen: int, op: Operation) -> None:
        with self.sim.cond:
            if node.gen != gen or self.nodes.get((node.zone, node.name)) is not node:
                self._finish(op, error={"code": 10, "message": "The node was deleted while it was being created"})
                return
            self._set_state(node, "READY")
            node.body["networkEndpoints"] = [{"ipAddress": "10.128.0.2", "port": 8470}]
            node.record.boots += 1
            node.runtime.boot()
            response = {"@type": NODE_TYPE, **node.body}
        self._finish(op, response=response)

    def get(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            return dict(self._get(zone, name).body)

    def list(self, zone: str) -> dict:
        with self.sim.cond:
            return {"nodes": [dict(n.body) for (z, _), n in sorted(self.nodes.items()) if z == zone]}

    def delete(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            node = self._get(zone, name)
            op = self._new_op(zone, "delete", self._path(zone, name))
            self._set_state(node, "DELETING")
            pending = node.shutdown
            threading.Thread(target=self._delete, args=(node, op, pending), name=f"tpu-delete-{name}", daemon=True).start()
        self.sim.emit(audit_entries.activity("google.cloud.tpu.v2.Tpu.DeleteNode", project=self.sim.project,
                                             resource_name=self._path(zone, name), service="tpu.googleapis.com"))
        return dict(op.body)

    def _delete(self, node: Node, op: Operation, pending: threading.Thread | None) -> None:
        if pending is not None:
            pending.join()
        node.runtime.power_off(self.sim.delete_grace)
        node.runtime.destroy()
        time.sleep(self.sim.op_delay)
        with self.sim.cond:
            if self.nodes.get((node.zone, node.name)) is node:
                del self.nodes[(node.zone, node.name)]
                node.gen += 1
                node.record.transition(self.sim.now(), "DELETED", False)
                node.record.deleted_at = self.sim.now()
        self._finish(op)

    def get_operation(self, name: str) -> dict:
        with self.sim.cond:
            op = self.operations.get(name)
            if op is None:
                raise rpc_error(404, f"Operation '{name}' was not found")
            return dict(op.body)

    # --- system events ----------------------------------------------------------------------------------------

    def preempt(self, zone: str, name: str, reason: str = "PREEMPTED") -> None:
        with self.sim.cond:
            node = self.nodes.get((zone, name))
            if node is None or node.state not in ("CREATING", "READY"):
                raise SimError(f"cannot preempt TPU node {zone}/{name}: it is "
                               f"{'absent' if node is None else node.state}; only a CREATING or READY node can be preempted")
            if node.runtime.metadata is not None:
                node.runtime.metadata.set("instance/preempted", "TRUE")
            gen = node.gen
            entries = [
                audit_entries.tpu_node_terminate(project=self.sim.project, zone=zone, node_name=name, reason=reason),
                audit_entries.compute_system_event("compute.instances.preempted", project=self.sim.project, zone=zone,
                                                   instance_name=node.worker, instance_id=node.worker_id),
            ]
            early = self.sim.audit_timing == "start"
        if early:
            for e in entries:
                self.sim.emit(e)

        def run():
            node.runtime.power_off(self.sim.notice_seconds)
            with self.sim.cond:
                if self.nodes.get((zone, name)) is node and node.gen == gen:
                    self._set_state(node, "PREEMPTED")
                    node.body.pop("networkEndpoints", None)
                node.shutdown = None
            if not early:
                for e in entries:
                    self.sim.emit(e)

        node.shutdown = threading.Thread(target=run, name=f"tpu-preempt-{name}", daemon=True)
        node.shutdown.start()

    def maintenance_event(self, zone: str, name: str, value: str) -> None:
        with self.sim.cond:
            node = self.nodes.get((zone, name))
            if node is None or node.runtime.metadata is None:
                raise SimError(f"TPU node {zone}/{name} is not running, so it has no metadata server to notify")
            node.runtime.metadata.set("instance/maintenance-event", value)
            if value != "NONE":
                node.body["health"] = "UNHEALTHY_MAINTENANCE"

    def usage(self, scope: str, accelerator: str, model: str | None, by_region: bool) -> int:
        # a PREEMPTED node no longer holds hardware, but it holds quota until deleted
        states = ("CREATING", "READY", "DELETING", "PREEMPTED") if by_region else LIVE
        return sum(
            1 for n in self.nodes.values()
            if (region_of(n.zone) if by_region else n.zone) == scope
            and n.accelerator == accelerator and (model is None or n.model == model) and n.state in states
        )


__all__ = ["TpuService", "worker_name"]
