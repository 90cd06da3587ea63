"""Spot VMs (provisioningModel SPOT; a TPU node's schedulingConfig.spot): the zone's spare capacity, taken back with
a 30 s notice (or the longer preemptionNoticeDuration, gcp-facts §17). A preemption STOPs the VM by default
(instanceTerminationAction, the spec's termination_action), which recovery.Strategy may start again in place."""

from __future__ import annotations

from respawn.schema import JobSpec, Tier

from .base import ComputeFields, Model, register


class Spot(Model):
    name = label = "spot"
    strategy_name = "spot"
    capacity_pool = "spot"
    quota_pool = "preemptible"  # the PREEMPTIBLE_* metrics (gcp-facts §21)
    price_key = "spot"
    restarts_in_place = True  # a STOP-terminated Spot GPU VM keeps its disk (recovery.Strategy.in_place)
    advised = True  # capacity advice scores Spot VMs alone (gcp-facts §20)

    def compute(self, spec: JobSpec, tier: Tier | None) -> ComputeFields:
        scheduling = {"provisioning_model": "SPOT", "instance_termination_action": spec.termination_action or "STOP",
                      "on_host_maintenance": "TERMINATE", "automatic_restart": False}
        if spec.notice_seconds:  # gcp-facts §17: the notice before the soft-off, Spot only
            scheduling["preemption_notice_duration"] = {"seconds": spec.notice_seconds}
        return ComputeFields(scheduling)

    def tpu_scheduling(self) -> dict[str, bool]:
        return {"spot": True}

    def queued_tier(self) -> str:
        return "spot"


SPOT = register(Spot())
