"""Compute Engine's system events on an instance: a preemption, a host error, a host maintenance event (and its
simulation, instances.simulateMaintenanceEvent), with the audit entries Compute writes for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from respawn import audit
from sim import audit_entries
from sim.compute_instance import RESERVATION
from sim.core import SimError, compute_error, rfc3339

if TYPE_CHECKING:
    from sim.compute import ComputeService


class SystemEvents:
    def __init__(self, compute: "ComputeService") -> None:
        self.compute = compute
        self.rt = compute.rt

    def preempt(self, zone: str, name: str) -> None:
        with self.rt.cond:
            inst = self.compute.instances.get((zone, name))
            if inst is not None and inst.model == "FLEX_START":
                raise SimError(f"cannot preempt instance {zone}/{name}: a FLEX_START VM is never preempted (gcp-facts "
                               "§18); its run ends at scheduling.maxRunDuration (sim.run_duration_scale shortens it)")
            if inst is not None and inst.model == RESERVATION:
                raise SimError(f"cannot preempt instance {zone}/{name}: a VM consuming a reservation is standard "
                               "provisioning, never preempted (gcp-facts §26); host maintenance still stops it")
            if inst is None or inst.status not in ("PROVISIONING", "STAGING", "RUNNING"):
                raise SimError(f"cannot preempt instance {zone}/{name}: it is "
                               f"{'absent' if inst is None else inst.status}; only a live instance can be preempted")
            op = self.compute.operations.new(zone, "compute.instances.preempted", self.compute.path(zone, name), inst.id, system=True)
            if inst.runtime.metadata is not None:
                inst.runtime.metadata.set("instance/preempted", "TRUE")
            # With a preemption notice duration the VM keeps running (instance/preempted TRUE) until the soft-off.
            notice = inst.notice_seconds
            if not notice:
                self.compute.set_status(inst, "STOPPING")
            entry = audit_entries.compute_system_event("compute.instances.preempted", project=self.rt.project, zone=zone, instance_name=name,
                                                       instance_id=inst.id)
            early = self.rt.audit_timing == "start"
        if early:
            self.rt.emit(entry)

        def after():
            if inst.termination_action == "DELETE":
                self.compute.tear_down(inst, op, None)
            else:
                self.compute.stopped(inst, op)
            if not early:
                self.rt.emit(entry)

        def soft_off():
            with self.rt.cond:
                if self.compute.instances.get((zone, name)) is not inst or inst.status != "RUNNING":
                    return  # deleted or stopped during its notice
                self.compute.set_status(inst, "STOPPING")
            self.compute.shut_down(inst, self.rt.notice_seconds, then=after)
        if notice:
            self.rt.scheduler.call_later(notice, soft_off)
        else:
            self.compute.shut_down(inst, self.rt.notice_seconds, then=after)

    def host_error(self, zone: str, name: str) -> None:
        with self.rt.cond:
            inst = self.compute.instances.get((zone, name))
            if inst is None or inst.status not in ("STAGING", "RUNNING"):
                raise SimError(f"cannot inject a host error into instance {zone}/{name}: it is "
                               f"{'absent' if inst is None else inst.status}; only a running instance has a host")
            self.compute.operations.new(zone, "compute.instances.hostError", self.compute.path(zone, name), inst.id, system=True)
            inst.runtime.crash()
            restart = bool(inst.body["scheduling"].get("automaticRestart")) and inst.model != "SPOT"
            self.compute.set_status(inst, "TERMINATED")
            inst.body["lastStopTimestamp"] = rfc3339()
            if restart:
                self.compute.set_status(inst, "STAGING")
                self.rt.scheduler.call_later(self.rt.op_delay, self.compute.to_running, inst, inst.gen,
                                             self.compute.operations.new(zone, "compute.instances.automaticRestart",
                                                           self.compute.path(zone, name), inst.id, system=True))
            entry = audit_entries.compute_system_event("compute.instances.hostError", project=self.rt.project,
                                                       zone=zone, instance_name=name, instance_id=inst.id)
        self.rt.emit(entry)

    def simulate_maintenance_event(self, zone: str, name: str) -> dict:
        """instances.simulateMaintenanceEvent (`gcloud compute instances simulate-maintenance-event`, gcp-facts §23):
        a VM that cannot live-migrate (every VM with GPUs) is terminated as its host maintenance policy says. A Spot
        VM is preempted (its notice, the soft-off, compute.instances.preempted); any other VM gets
        instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE, then after notice_seconds the soft-off and
        TERMINATED, with a compute.instances.terminateOnHostMaintenance entry. The operation ends at once."""
        with self.rt.cond:
            inst = self.compute.find(zone, name)
            if inst.status != "RUNNING":
                raise compute_error(400, "resourceNotReady", f"The resource '{self.compute.path(zone, name)}' is not ready: "
                                    f"a maintenance event is simulated on a RUNNING instance, not {inst.status}")
            op = self.compute.operations.new(zone, "simulateMaintenanceEvent", self.compute.path(zone, name), inst.id)
            spot = inst.model == "SPOT"
        self.rt.scheduler.call_later(self.rt.op_delay, self.compute.operations.finish, op)
        if spot:
            self.preempt(zone, name)
            return dict(op.body)
        self.maintenance_event(zone, name, "TERMINATE_ON_HOST_MAINTENANCE")

        def terminate() -> None:
            with self.rt.cond:
                if self.compute.instances.get((zone, name)) is not inst or inst.status != "RUNNING":
                    return
                self.compute.set_status(inst, "STOPPING")
                self.compute.shut_down(inst, self.rt.notice_seconds, then=lambda: self.compute.stopped(inst, None))
                entry = audit_entries.compute_system_event(audit.TERMINATE_ON_HOST_MAINTENANCE,
                                                           project=self.rt.project, zone=zone, instance_name=name,
                                                           instance_id=inst.id)
            self.rt.emit(entry)

        self.rt.scheduler.call_later(self.rt.notice_seconds, terminate)
        return dict(op.body)

    def maintenance_event(self, zone: str, name: str, value: str) -> None:
        with self.rt.cond:
            inst = self.compute.instances.get((zone, name))
            if inst is None or inst.runtime.metadata is None:
                raise SimError(f"instance {zone}/{name} is not running, so it has no metadata server to notify")
            inst.runtime.metadata.set("instance/maintenance-event", value)
