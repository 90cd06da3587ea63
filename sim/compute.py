"""The Compute Engine v1 subset: zonal instances, with the lifecycle our code depends on.

Instance status: PROVISIONING -> STAGING -> RUNNING (insert/start), RUNNING -> STOPPING -> TERMINATED (stop, or
preemption with termination action STOP), deleted (delete, or preemption with termination action DELETE).
Operations progress on the scheduler; an insert/start operation is DONE when the instance is RUNNING.

Flex-start VMs (provisioningModel FLEX_START, docs/gcp-facts.md §18): capacity is their own model in the capacity
timeline, quota is the preemptible one. With no capacity and params.requestValidForDuration >= 90 s the instance
waits in status PENDING (not live, not billed) until capacity frees up in its zone (then PROVISIONING -> STAGING ->
RUNNING) or the wait runs out (then Compute deletes it: 404). While RUNNING, resourceStatus.scheduling.
terminationTimestamp is the run's end (start + maxRunDuration, set at every start); then the VM is stopped or
deleted as instanceTerminationAction says, as Compute's own stop or delete, never as a preemption. Both durations
pass sim.run_duration_scale times faster in wall time, and terminationTimestamp is the compressed end.

Quota, capacity and reservations: sim/compute_capacity.py; operations: sim/compute_operations.py; images and
firewall rules: sim/compute_global.py; preemption, host errors and maintenance: sim/compute_events.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import threading
import time

from respawn.agent.run_end import ENV_BOOT_TIME
from sim import audit_entries
from sim.capacity import region_of
from sim.compute_capacity import CapacityChecks
from sim.compute_events import SystemEvents
from sim.compute_global import GlobalResources
from sim.compute_instance import (BASE, LIVE, NAME_RE, RESERVATION, Instance, check_notice_duration,
                                  check_run_duration, duration_seconds, last, match_filter, quota_model)
from sim.compute_operations import Operation, ZoneOperations
from sim.core import NodeRecord, compute_error, compute_found, rfc3339
from sim.runtime import SimRuntime

SERIAL_BUFFER = 1 << 20  # bytes of serial port output Compute Engine keeps (getSerialPortOutput: "the last 1 MB")


class ComputeService:
    def __init__(self, rt: SimRuntime) -> None:
        self.rt = rt
        self.instances: dict[tuple[str, str], Instance] = {}
        self._ids = random.Random(1)
        # One id sequence for instances, operations, images and firewall rules, as when one class held them all.
        self.operations = ZoneOperations(rt, self._new_id)
        self.global_resources = GlobalResources(rt, self._new_id)  # images and firewall rules
        self.checks = CapacityChecks(rt)
        self.events = SystemEvents(self)
        self.queue: list[Instance] = []  # PENDING flex-start instances, first asked first served
        self._serving = False  # a pass over the queue is scheduled
        self.queue_passes = 0  # passes over the queue so far (a test waits for some instead of sleeping)

    def path(self, zone: str, name: str) -> str:
        return f"projects/{self.rt.project}/zones/{zone}/instances/{name}"

    def find(self, zone: str, name: str) -> Instance:
        return compute_found(self.instances, (zone, name), self.path(zone, name))

    def _new_id(self) -> str:
        return str(self._ids.randrange(10**18, 10**19))

    def set_status(self, inst: Instance, status: str) -> None:
        inst.status = status
        inst.gen += 1
        inst.body["status"] = status
        if status != "RUNNING":  # the run's end (the sim's only resourceStatus) is known only while it runs (§18)
            inst.body.pop("resourceStatus", None)
        inst.record.transition(self.rt.now(), status, status in LIVE)

    # --- API ------------------------------------------------------------------------------------------------

    def insert(self, zone: str, body: dict) -> dict:
        name = body.get("name", "")
        if not NAME_RE.match(name):
            raise compute_error(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. "
                                "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        if not body.get("machineType"):
            raise compute_error(400, "invalid", "Invalid value for field 'resource.machineType': ''. A machine type is required.")
        with self.rt.cond:
            if (zone, name) in self.instances:
                raise compute_error(409, "alreadyExists", f"The resource '{self.path(zone, name)}' already exists")
            self.global_resources.check_source_image(body)
            machine_type = last(body["machineType"])
            accels = body.get("guestAccelerators") or []
            accelerator = last(accels[0]["acceleratorType"]) if accels else machine_type
            count = int(accels[0].get("acceleratorCount", 1)) if accels else 0
            scheduling = dict(body.get("scheduling") or {})
            requested = scheduling.get("provisioningModel")
            model = ("FLEX_START" if requested == "FLEX_START" else
                     "SPOT" if requested == "SPOT" or scheduling.get("preemptible") else "STANDARD")
            reservation, ends_at = "", None
            consume = (body.get("reservationAffinity") or {}).get("consumeReservationType")
            if consume == "SPECIFIC_RESERVATION":
                if model != "STANDARD":
                    raise compute_error(400, "invalid", "Invalid value for field 'resource.reservationAffinity': "
                                                        f"a {model} VM cannot consume a reservation")
                reservation, model = self.checks.reservation(zone, body, accelerator), RESERVATION
                ends_at = self.checks.bound(zone, accelerator, requested, scheduling)
            elif requested == "RESERVATION_BOUND":
                raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                                    "'RESERVATION_BOUND'. It needs a SPECIFIC_RESERVATION affinity")
            check_notice_duration(scheduling, model)
            check_run_duration(body, scheduling, model)
            iid = self._new_id()
            op = self.operations.new(zone, "insert", self.path(zone, name), iid)
            refusal = self.checks.refusal(zone, accelerator, model, machine_type, count, reservation)
            # A flex-start request that may wait waits for capacity; a quota refusal is final (gcp-facts §18).
            wait = duration_seconds((body.get("params") or {}).get("requestValidForDuration"))
            queued = (model == "FLEX_START" and wait > 0 and refusal is not None
                      and refusal[0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED")
            if refusal and not queued:
                self.rt.op_step(zone, self.rt.op_delay, self.operations.finish, op, *refusal)
                return dict(op.body)
            if model == "SPOT":
                scheduling.setdefault("provisioningModel", "SPOT")
                scheduling.setdefault("instanceTerminationAction", "STOP")
                scheduling.setdefault("automaticRestart", False)
            scheduling.setdefault("onHostMaintenance", "TERMINATE" if accels or model == "SPOT" else "MIGRATE")
            resource = dict(body)
            resource.update({
                "kind": "compute#instance", "id": iid, "creationTimestamp": rfc3339(),
                "zone": f"{BASE}/projects/{self.rt.project}/zones/{zone}",
                "machineType": f"{BASE}/projects/{self.rt.project}/zones/{zone}/machineTypes/{machine_type}",
                "selfLink": f"{BASE}/{self.path(zone, name)}", "scheduling": scheduling,
                "guestAccelerators": [
                    {"acceleratorType": f"{BASE}/projects/{self.rt.project}/zones/{zone}/acceleratorTypes/{last(a['acceleratorType'])}",
                     "acceleratorCount": int(a.get("acceleratorCount", 1))} for a in accels],
                "metadata": {"kind": "compute#metadata", "fingerprint": "c2ltLW1ldGFkYXRh",
                             "items": list((body.get("metadata") or {}).get("items") or [])},
                "labels": dict(body.get("labels") or {}), "labelFingerprint": "c2ltLWxhYmVscw==",
            })
            if not accels:
                resource.pop("guestAccelerators")
            nics = [dict(n) for n in body.get("networkInterfaces") or [{"network": "global/networks/default"}]]
            nics[0]["networkIP"], host = self.rt.new_hosts(name)[0]
            resource["networkInterfaces"] = nics
            record = NodeRecord("instance", zone, name, dict(resource["labels"]), accelerator, model, self.rt.now())
            runtime = self.rt.node_runtime("compute", zone, name, self._metadata_kwargs(zone, name, iid, machine_type, resource),
                                           host=host)
            inst = Instance(zone, name, resource, "", record, runtime, accelerator, model, ends_at=ends_at)
            self.instances[(zone, name)] = inst
            self.rt.records.append(record)
            if queued:
                self._enqueue(inst, op, wait)
            else:
                self.set_status(inst, "PROVISIONING")
                self.rt.op_step(zone, self.rt.op_delay, self._to_staging, inst, inst.gen, op)
        self.rt.emit(audit_entries.activity("v1.compute.instances.insert", project=self.rt.project,
                                            resource_name=self.path(zone, name)))
        return dict(op.body)

    def _metadata_kwargs(self, zone: str, name: str, iid: str, machine_type: str, resource: dict) -> dict:
        items = resource["metadata"]["items"]
        return {"name": name, "zone": zone, "project": self.rt.project, "instance_id": iid,
                "machine_type": machine_type, "attributes": {i["key"]: i.get("value", "") for i in items},
                "address": resource["networkInterfaces"][0]["networkIP"]}

    # --- flex-start: the wait for capacity and the run's end (gcp-facts §18) ------------------------------------

    def _enqueue(self, inst: Instance, op: Operation, wait: float) -> None:
        """PENDING until capacity frees up in the zone, or until the request's validity ends (under the lock)."""
        self.set_status(inst, "PENDING")
        self.queue.append(inst)
        # Unverified (gcp-facts §18): whether the insert operation ends when the request is queued or stays open
        # for the whole wait (gcloud is said to block until capacity comes or the request expires). "done" (the
        # default) ends it at once, so a caller must read the instance (PENDING) to know whether the VM runs;
        # "wait" keeps it open and ends it when the VM runs or, with ZONE_RESOURCE_POOL_EXHAUSTED, when the wait
        # runs out, so a caller that blocks on it meets its own timeout. A caller robust to both never takes a
        # DONE insert for a running VM and never takes an unfinished one for a failure.
        if self.rt.flex_start_insert == "wait":
            inst.pending_op = op
        else:
            self.rt.op_step(inst.zone, self.rt.op_delay, self.operations.finish, op)
        self.rt.scheduler.call_later(wait * self.rt.run_duration_scale, self._expire, inst, inst.gen)
        if not self._serving:
            self._serving = True
            self.rt.scheduler.call_later(self._serve_interval(), self._serve_queue)

    def _serve_interval(self) -> float:
        return max(self.rt.op_delay, 0.05)

    def _serve_queue(self) -> None:
        """Give freed capacity (and quota) to the PENDING instances, first asked first; again while any waits."""
        with self.rt.cond:
            self.queue_passes += 1
            for inst in list(self.queue):
                if inst.deleting or self.instances.get((inst.zone, inst.name)) is not inst or inst.status != "PENDING":
                    self.queue.remove(inst)
                    continue
                if self.checks.refusal(inst.zone, inst.accelerator, inst.model, *inst.shape) is not None:
                    continue
                self.queue.remove(inst)
                op, inst.pending_op = inst.pending_op, None
                self.set_status(inst, "PROVISIONING")
                self.rt.op_step(inst.zone, self.rt.op_delay, self._to_staging, inst, inst.gen, op)
            self._serving = bool(self.queue)
            if self._serving:
                self.rt.scheduler.call_later(self._serve_interval(), self._serve_queue)

    def _expire(self, inst: Instance, gen: int) -> None:
        """The request's validity ran out with no capacity: Compute deletes the instance (no audit entry known)."""
        with self.rt.cond:
            if inst.gen != gen or inst.deleting or self.instances.get((inst.zone, inst.name)) is not inst:
                return  # it got capacity, or was deleted
            del self.instances[(inst.zone, inst.name)]
            if inst in self.queue:
                self.queue.remove(inst)
            inst.gen += 1
            inst.record.deleted(self.rt.now())
            op, inst.pending_op = inst.pending_op, None
        inst.runtime.destroy()
        self.operations.finish(op, *self.checks.stockout(inst.zone, inst.accelerator, *inst.shape))

    def _boot_env(self, inst: Instance) -> dict[str, str]:
        """A limited run's VM tells its agent when it started (the host's kernel boot is not its own), shifted so
        that the agent's end (start + maxRunDuration) falls where the sim's compressed end does."""
        if not inst.run_seconds:
            return {}
        return {ENV_BOOT_TIME: repr(time.time() - inst.run_seconds * (1 - self.rt.run_duration_scale))}

    def _run_ended(self, inst: Instance, gen: int) -> None:
        """maxRunDuration is over (or the reservation of a reservation-bound VM ended): the termination action, as
        Compute's own stop or delete. Not a preemption:
        instance/preempted stays FALSE and no compute.instances.preempted entry is written; no gracefulShutdown
        (refused at insert for a limited run time, gcp-facts §17)."""
        with self.rt.cond:
            if inst.gen != gen or self.instances.get((inst.zone, inst.name)) is not inst or inst.status != "RUNNING":
                return  # stopped, restarted or deleted since: that run's end no longer applies
            self.set_status(inst, "STOPPING")
            if inst.termination_action == "DELETE":
                inst.deleting = True
                threading.Thread(target=self.tear_down, args=(inst, None, inst.shutdown), name=f"run-end-{inst.name}",
                                 daemon=True).start()
            else:
                self.shut_down(inst, self.rt.notice_seconds, then=lambda: self.stopped(inst, None))

    # --- lifecycle steps --------------------------------------------------------------------------------------

    def _to_staging(self, inst: Instance, gen: int, op: Operation | None) -> None:
        with self.rt.cond:
            if inst.gen != gen or self.instances.get((inst.zone, inst.name)) is not inst:
                self.operations.finish(op)  # deleted or preempted while provisioning: the insert still ends
                return
            self.set_status(inst, "STAGING")
            self.rt.op_step(inst.zone, self.rt.op_delay, self.to_running, inst, inst.gen, op)

    def to_running(self, inst: Instance, gen: int, op: Operation | None) -> None:
        with self.rt.cond:
            if inst.gen != gen or self.instances.get((inst.zone, inst.name)) is not inst:
                self.operations.finish(op)
                return
            self.set_status(inst, "RUNNING")
            inst.body["lastStartTimestamp"] = rfc3339()
            if inst.run_seconds:  # every start begins a new run (gcp-facts §18)
                wall = inst.run_seconds * self.rt.run_duration_scale
                inst.body["resourceStatus"] = {"scheduling": {"terminationTimestamp": rfc3339(time.time() + wall)}}
                self.rt.scheduler.call_later(wall, self._run_ended, inst, inst.gen)
            if inst.ends_at is not None:  # a reservation-bound VM ends with its reservation, at every start
                self.rt.scheduler.call_later(inst.ends_at - time.time(), self._run_ended, inst, inst.gen)
            inst.record.boots += 1
            inst.runtime.boot(self._boot_env(inst))
        self.operations.finish(op)

    def get(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            return dict(self.find(zone, name).body)

    def serial_port_output(self, zone: str, name: str, port: int = 1, start: int = 0) -> dict:
        """instances.getSerialPortOutput: port 1 is the node's console log (what its boots printed). Positions are
        byte offsets over everything written; only the last SERIAL_BUFFER bytes are kept, and a start before them
        is moved up to the oldest kept (the answer's `start` says where it began); a negative start asks for that
        many of the most recent bytes. Ports 2-4 are empty (nothing in the guest writes to them)."""
        if not 1 <= port <= 4:
            raise compute_error(400, "invalid", f"Invalid value for field 'port': '{port}'. Must be between 1 and 4.")
        with self.rt.cond:
            inst = self.find(zone, name)
            path = inst.runtime.console_log
        try:
            data = path.read_bytes() if port == 1 else b""
        except FileNotFoundError:
            data = b""
        size = len(data)
        oldest = max(0, size - SERIAL_BUFFER)
        begin = max(size + start, oldest) if start < 0 else max(start, oldest)
        begin = min(begin, size)
        return {"kind": "compute#serialPortOutput", "contents": data[begin:].decode("utf-8", "replace"),
                "start": str(begin), "next": str(size),
                "selfLink": f"{BASE}/{self.path(zone, name)}/serialPort"}

    def set_metadata(self, zone: str, name: str, body: dict) -> dict:
        """instances.setMetadata: the whole item list is replaced, conditional on the fingerprint the caller read
        (412 conditionNotMet when it changed since: optimistic locking, gcp-facts). A running node's metadata
        server serves the new attributes at once, waking its hanging GETs; a node not booted yet gets them at boot."""
        items = [{"key": i["key"], "value": i.get("value", "")} for i in body.get("items") or []]
        with self.rt.cond:
            inst = self.find(zone, name)
            current = inst.body["metadata"]
            if body.get("fingerprint") != current["fingerprint"]:
                raise compute_error(412, "conditionNotMet", "Supplied fingerprint does not match current metadata "
                                    "fingerprint.")
            before = {i["key"]: i.get("value", "") for i in current["items"]}
            after = {i["key"]: i["value"] for i in items}
            digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode() + inst.id.encode()).digest()
            inst.body["metadata"] = {"kind": "compute#metadata", "items": items,
                                     "fingerprint": base64.b64encode(digest[:8]).decode()}
            inst.runtime.set_attributes(before.keys() - after.keys(), after)
            op = self.operations.new(zone, "setMetadata", self.path(zone, name), inst.id)
            self.rt.scheduler.call_later(self.rt.metadata_op_delay, self.operations.finish, op)
        return dict(op.body)

    def list(self, zone: str, filter_text: str | None) -> dict:
        with self.rt.cond:
            items = [dict(i.body) for (z, _), i in sorted(self.instances.items()) if z == zone]
        if filter_text:
            items = [i for i in items if match_filter(i, filter_text)]
        return {"kind": "compute#instanceList", "id": f"projects/{self.rt.project}/zones/{zone}/instances",
                "items": items, "selfLink": f"{BASE}/projects/{self.rt.project}/zones/{zone}/instances"}

    def start(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            inst = self.find(zone, name)
            op = self.operations.new(zone, "start", self.path(zone, name), inst.id)
            if inst.status == "STOPPING":
                raise compute_error(400, "resourceNotReady", f"The resource '{self.path(zone, name)}' is not ready")
            if inst.status != "TERMINATED":
                self.rt.op_step(zone, self.rt.op_delay, self.operations.finish, op)
                return dict(op.body)
            refusal = self.checks.refusal(zone, inst.accelerator, inst.model, *inst.shape)
            if refusal:
                self.rt.op_step(zone, self.rt.op_delay, self.operations.finish, op, *refusal)
                return dict(op.body)
            self.set_status(inst, "STAGING")
            self.rt.op_step(zone, self.rt.op_delay, self.to_running, inst, inst.gen, op)
        return dict(op.body)

    def stop(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            inst = self.find(zone, name)
            if inst.status == "PENDING":  # unverified what Compute does; the sim asks for a delete instead
                raise compute_error(400, "resourceNotReady", f"The resource '{self.path(zone, name)}' is not ready: "
                                    "it is waiting for capacity (PENDING); delete it to withdraw the request")
            op = self.operations.new(zone, "stop", self.path(zone, name), inst.id)
            if inst.status in ("TERMINATED", "STOPPING", "PENDING_STOP"):
                self.rt.scheduler.call_later(self.rt.op_delay, self.operations.finish, op)
                return dict(op.body)
            graceful = inst.graceful_shutdown_seconds
            self.set_status(inst, "PENDING_STOP" if graceful else "STOPPING")
            self.shut_down(inst, graceful or self.rt.notice_seconds, then=lambda: self.stopped(inst, op))
        return dict(op.body)

    def delete(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            inst = self.find(zone, name)
            op = self.operations.new(zone, "delete", self.path(zone, name), inst.id)
            graceful = inst.graceful_shutdown_seconds if inst.status in LIVE else 0.0
            inst.deleting = True
            if inst.status in LIVE:
                self.set_status(inst, "PENDING_STOP" if graceful else "STOPPING")
            pending = inst.shutdown
            threading.Thread(target=self.tear_down, args=(inst, op, pending, graceful), name=f"delete-{name}",
                             daemon=True).start()
        self.rt.emit(audit_entries.activity("v1.compute.instances.delete", project=self.rt.project,
                                            resource_name=self.path(zone, name)))
        return dict(op.body)

    def tear_down(self, inst: Instance, op: Operation | None, pending: threading.Thread | None, grace: float = 0.0) -> None:
        if pending is not None:
            pending.join()
        inst.runtime.power_off(grace or self.rt.delete_grace)
        inst.runtime.destroy()
        with self.rt.cond:
            if self.instances.get((inst.zone, inst.name)) is inst:
                del self.instances[(inst.zone, inst.name)]
                inst.gen += 1
                inst.record.deleted(self.rt.now())
            insert, inst.pending_op = inst.pending_op, None
        self.operations.finish(insert)  # a withdrawn flex-start request's insert ends, as one deleted while provisioning
        self.operations.finish(op)

    def shut_down(self, inst: Instance, grace: float, then) -> None:
        """ACPI soft off in the background; `then` runs once the guest is gone (under no lock)."""
        def run():
            inst.runtime.power_off(grace)
            then()
        inst.shutdown = threading.Thread(target=run, name=f"shutdown-{inst.name}", daemon=True)
        inst.shutdown.start()

    def stopped(self, inst: Instance, op: Operation | None) -> None:
        with self.rt.cond:
            if self.instances.get((inst.zone, inst.name)) is inst and inst.status in ("PENDING_STOP", "STOPPING"):
                self.set_status(inst, "TERMINATED")
                inst.body["lastStopTimestamp"] = rfc3339()
            inst.shutdown = None
        if op is not None:
            self.operations.finish(op)

    def snapshots(self) -> list[dict]:
        """Every instance, as SimServer.instances() lists it (under the lock)."""
        out = []
        for i in self.instances.values():
            snap = i.runtime.snapshot("instance", i.zone, i.name, i.status, i.body.get("labels", {}),
                                      {it["key"]: it.get("value", "") for it in i.body["metadata"]["items"]})
            snap.update(id=i.id, address=i.body["networkInterfaces"][0]["networkIP"],
                        service_account=(i.body.get("serviceAccounts") or [{}])[0].get("email"))
            out.append(snap)
        return out

    def usage(self, zone_or_region: str, accelerator: str, model: str | None, by_region: bool) -> int:
        """Live instances holding capacity in a zone or, by_region, quota in a region (`model`: the quota pool)."""
        return sum(
            1 for i in self.instances.values()
            if (region_of(i.zone) if by_region else i.zone) == zone_or_region
            and i.accelerator == accelerator and i.status in LIVE
            and (model is None or (quota_model(i.model) if by_region else i.model) == model)
            and not (by_region and i.model == RESERVATION)  # the reservation holds its quota, not its VMs
        )

