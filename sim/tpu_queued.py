"""Cloud TPU v2 queued resources (gcp-facts §19): a request for one TPU node that waits for capacity.

States: CREATING → WAITING_FOR_RESOURCES (the create operation ends here, as Cloud TPU's does: Google's sample
python-docs-samples tpu/queued_resources_create.py) → PROVISIONING (the zone has the hardware: the node is made,
CREATING) → ACTIVE (the node is READY). A request still waiting when its `queueingPolicy.validUntilDuration` ends
is FAILED (failedData.error).
A Spot request whose node is preempted goes SUSPENDING (its node PREEMPTED, then deleted by the service) →
SUSPENDED, stateInitiator SERVICE, and is never queued again; a node deleted by the user does the same (USER).
Waiting requests get the zone's hardware first asked, first served, as the capacity model frees it.

Quota: a request holds its region's TPU quota in every state, SUSPENDED and FAILED included, until it is deleted
(its node is not counted a second time). A create past the quota ends its operation with code 8, as a node's does,
and the request never exists. Capacity: only its node holds hardware (the capacity model of sim/capacity.py).

Delete: `force=true` deletes the request's node first, in any state; without force, only a request in ACCEPTED,
WAITING_FOR_RESOURCES, FAILED or SUSPENDED (or one whose node is gone) is deleted, anything else answers 400
FAILED_PRECONDITION (gcp-facts §19; WAITING_FOR_RESOURCES counted as ACCEPTED, unverified). The wait
(validUntilDuration) passes `sim.run_duration_scale` times faster in wall time, as a flex-start VM's does.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.capacity import region_of
from sim.core import ApiError, NodeRecord, found, rfc3339, rpc_error
from sim.runtime import SimRuntime

if TYPE_CHECKING:
    from sim.tpu import Node, Operation, TpuService

QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES")
# A delete without force is refused in any other state while the request's node exists (DeleteQueuedResourceRequest).
DELETABLE = ("ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)s$")


@dataclass
class Request:
    zone: str
    name: str  # the queued resource id
    body: dict  # as served
    node_id: str
    node_body: dict  # the node spec's node
    accelerator: str
    hosts: int
    model: str  # SPOT (tier spot) or STANDARD (guaranteed, or no tier)
    record: NodeRecord  # live = the request exists (holds quota)
    gen: int = 0

    @property
    def state(self) -> str:
        return self.body["state"]["state"]


class QueuedResources:
    def __init__(self, rt: SimRuntime, tpu: "TpuService") -> None:
        self.rt = rt
        self.tpu = tpu
        self.requests: dict[tuple[str, str], Request] = {}
        self.records: list[NodeRecord] = []
        self.queue: list[Request] = []  # waiting, first asked first served
        self._serving = False

    def _path(self, zone: str, name: str) -> str:
        return f"projects/{self.rt.project}/locations/{zone}/queuedResources/{name}"

    def _get(self, zone: str, name: str) -> Request:
        return found(self.requests, zone, name, self._path(zone, name))

    def _set_state(self, req: Request, state: str, initiator: str | None = None, error: dict | None = None) -> None:
        data = {"FAILED": "failedData", "ACTIVE": "activeData", "SUSPENDED": "suspendedData",
                "SUSPENDING": "suspendingData", "CREATING": "creatingData", "PROVISIONING": "provisioningData",
                "DELETING": "deletingData", "ACCEPTED": "acceptedData"}.get(state)
        body: dict = {"state": state}
        if data is not None:
            body[data] = {"error": error} if error is not None else {}
        if initiator is not None:
            body["stateInitiator"] = initiator
        req.body["state"] = body
        req.gen += 1
        req.record.transition(self.rt.now(), state, True)

    # --- API ------------------------------------------------------------------------------------------------

    def create(self, zone: str, qr_id: str, body: dict) -> dict:
        if not re.match(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", qr_id or ""):
            raise rpc_error(400, f"Invalid queued resource id '{qr_id}': it must match [a-z]([-a-z0-9]*[a-z0-9])?")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if len(specs) != 1:
            raise rpc_error(400, f"Invalid queued resource: tpu.node_spec has {len(specs)} entries; the sim serves one")
        spec = specs[0]
        parent = f"projects/{self.rt.project}/locations/{zone}"
        if spec.get("parent") != parent:
            raise rpc_error(400, f"Invalid node spec: parent is {spec.get('parent')!r}, not the request's {parent!r}")
        if spec.get("multisliceParams") or not spec.get("nodeId"):
            raise rpc_error(400, "Invalid node spec: node_id is required (the sim does not serve multislice_params)")
        node_body = dict(spec.get("node") or {})
        accelerator, hosts = self.tpu.validate(spec["nodeId"], node_body)
        if "spot" in body and "guaranteed" in body:
            raise rpc_error(400, "Invalid queued resource: spot and guaranteed are one of a oneof (tier)")
        model = "SPOT" if "spot" in body else "STANDARD"
        policy = body.get("queueingPolicy") or {}
        if set(policy) - {"validUntilDuration"}:
            raise rpc_error(400, f"Invalid queueing policy {sorted(policy)}: the sim serves validUntilDuration only")
        wait = None
        if "validUntilDuration" in policy:
            m = _DURATION.match(str(policy["validUntilDuration"]))
            if m is None:
                raise rpc_error(400, f"Invalid queueing_policy.valid_until_duration {policy['validUntilDuration']!r}")
            wait = float(m.group(1))
        with self.rt.cond:
            if (zone, qr_id) in self.requests:
                raise rpc_error(409, f"Resource '{self._path(zone, qr_id)}' already exists")
            op = self.tpu.new_op(zone, "create", self._path(zone, qr_id))
            refusal = self.tpu.quota_refusal(zone, accelerator, model)
            if refusal:
                self.rt.op_step(zone, self.rt.op_delay, lambda: self.tpu.finish(op, error=refusal))
                return dict(op.body)
            served = {k: v for k, v in body.items() if k in ("tpu", "spot", "guaranteed", "queueingPolicy",
                                                             "reservationName")}
            served.update(name=self._path(zone, qr_id), createTime=rfc3339())
            labels = dict(node_body.get("labels") or {})
            record = NodeRecord("queued-resource", zone, qr_id, labels, accelerator, model, self.rt.now())
            req = Request(zone, qr_id, served, spec["nodeId"], node_body, accelerator, hosts, model, record)
            self.requests[(zone, qr_id)] = req
            self.records.append(record)
            self._set_state(req, "CREATING")
            self.rt.op_step(zone, self.rt.op_delay, self._queued, req, req.gen, op)
            if wait is not None:
                self.rt.scheduler.call_later(wait * self.rt.run_duration_scale, self._expire, req, wait)
        return dict(op.body)

    def _queued(self, req: Request, gen: int, op: "Operation") -> None:
        with self.rt.cond:
            if req.gen == gen and self.requests.get((req.zone, req.name)) is req:
                self._set_state(req, "WAITING_FOR_RESOURCES")
                self.queue.append(req)
                if not self._serving:
                    self._serving = True
                    self.rt.scheduler.call_later(self._interval(), self._serve)
            response = {"@type": QR_TYPE, **req.body}
        self.tpu.finish(op, response=response)

    def _interval(self) -> float:
        return max(self.rt.op_delay, 0.05)

    def _serve(self) -> None:
        """Give the zone's free hardware to the waiting requests, first asked first; again while any waits."""
        with self.rt.cond:
            for req in list(self.queue):
                if self.requests.get((req.zone, req.name)) is not req or req.state not in WAITING:
                    self.queue.remove(req)
                    continue
                if self.tpu.capacity_refusal(req.zone, req.accelerator, req.model) is not None:
                    continue
                self.queue.remove(req)
                if (req.zone, req.node_id) in self.tpu.nodes:
                    self._set_state(req, "FAILED", "SERVICE", {"code": 6, "message": f"Node '{req.node_id}' "
                                                                                      "already exists"})
                    continue
                self._set_state(req, "PROVISIONING")
                self.tpu.make_node(req.zone, req.node_id, req.node_body, req.accelerator, req.hosts, req.model, None,
                                   request=self._path(req.zone, req.name))
            self._serving = bool(self.queue)
            if self._serving:
                self.rt.scheduler.call_later(self._interval(), self._serve)

    def _expire(self, req: Request, wait: float) -> None:
        with self.rt.cond:
            if self.requests.get((req.zone, req.name)) is req and req.state in WAITING:
                self._set_state(req, "FAILED", "SERVICE", {
                    "code": 4, "message": f"The queued resource was not provisioned within its valid_until_duration "
                                          f"({wait:g}s): no capacity in {req.zone}"})

    def get(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            return dict(self._get(zone, name).body)

    def list(self, zone: str) -> dict:
        with self.rt.cond:
            return {"queuedResources": [dict(r.body) for (z, _), r in sorted(self.requests.items()) if z == zone]}

    def delete(self, zone: str, name: str, force: bool) -> dict:
        with self.rt.cond:
            req = self._get(zone, name)
            node = self.tpu.nodes.get((zone, req.node_id))
            mine = node is not None and node.request == self._path(zone, name)
            if not force and mine and req.state not in DELETABLE:
                raise rpc_error(400, f"Queued resource '{self._path(zone, name)}' is {req.state}: it can be deleted "
                                     "only in ACCEPTED, WAITING_FOR_RESOURCES, FAILED or SUSPENDED, or with force",
                                grpc_status="FAILED_PRECONDITION")
            op = self.tpu.new_op(zone, "delete", self._path(zone, name))
            if req.state != "DELETING":
                self._set_state(req, "DELETING")
            threading.Thread(target=self._delete, args=(req, node if mine else None, op),
                             name=f"tpu-qr-delete-{name}", daemon=True).start()
        return dict(op.body)

    def _delete(self, req: Request, node: "Node | None", op: "Operation") -> None:
        if node is not None:
            with self.rt.cond:
                present = self.tpu.nodes.get((node.zone, node.name)) is node and node.state != "DELETING"
            if present:  # outside the lock: the delete writes an audit entry (SimRuntime.emit)
                try:
                    self.tpu.delete(node.zone, node.name)
                except ApiError:  # gone meanwhile (the service's delete after a preemption)
                    pass
            self.rt.wait_for(lambda: self.tpu.nodes.get((node.zone, node.name)) is not node,
                             timeout=max(60.0, self.rt.delete_grace * 4), what=f"{node.name} deleted")
        time.sleep(self.rt.op_delay)
        with self.rt.cond:
            if self.requests.get((req.zone, req.name)) is req:
                del self.requests[(req.zone, req.name)]
                if req in self.queue:
                    self.queue.remove(req)
                req.gen += 1
                req.record.deleted(self.rt.now())
        self.tpu.finish(op)

    # --- what the request's node tells it (under the lock) --------------------------------------------------

    def _of(self, node: "Node") -> Request | None:
        req = self.requests.get((node.zone, (node.request or "").rsplit("/", 1)[-1]))
        return req if req is not None and req.node_id == node.name else None

    def node_ready(self, node: "Node") -> None:
        req = self._of(node)
        if req is not None and req.state == "PROVISIONING":
            self._set_state(req, "ACTIVE")

    def node_preempted(self, node: "Node") -> None:
        """A Spot request's node was preempted: SUSPENDING while the service deletes the node, then SUSPENDED."""
        req = self._of(node)
        if req is None or req.state in ("DELETING", "SUSPENDING", "SUSPENDED"):
            return
        self._set_state(req, "SUSPENDING", "SERVICE")
        threading.Thread(target=self.tpu.delete, args=(node.zone, node.name), daemon=True).start()

    def node_deleted(self, node: "Node") -> None:
        """The request's node is gone: the request is SUSPENDED (by the service after a preemption, else by the
        user who deleted the node), unless the request itself is being deleted."""
        req = self._of(node)
        if req is None or req.state in ("DELETING", "SUSPENDED", "FAILED"):
            return
        initiator = "SERVICE" if req.state == "SUSPENDING" else "USER"
        self._set_state(req, "SUSPENDED", initiator)

    def snapshots(self) -> list[dict]:
        """Every request that exists now, as SimServer.queued_resources() lists it (under the lock)."""
        return [{"zone": r.zone, "name": r.name, "state": r.state, "nodeId": r.node_id,
                 "stateInitiator": r.body["state"].get("stateInitiator"), "labels": dict(r.record.labels)}
                for r in self.requests.values()]

    def usage(self, region: str, accelerator: str, model: str | None) -> int:
        """Quota held: every request in the region, whatever its state."""
        return sum(1 for r in self.requests.values() if region_of(r.zone) == region and r.accelerator == accelerator
                   and (model is None or r.model == model))


__all__ = ["QueuedResources", "DELETABLE"]
