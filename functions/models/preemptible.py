"""Preemptible VMs (scheduling.preemptible; a TPU node's schedulingConfig.preemptible), the older form of Spot: the
same spare capacity and quota, at most 24 h. A Cloud TPU queued resource has no preemptible tier."""

from __future__ import annotations

from respawn.schema import JobSpec, Tier

from .base import ComputeFields, Model, register


class Preemptible(Model):
    name = label = strategy_name = "preemptible"
    capacity_pool = "spot"
    quota_pool = "preemptible"
    price_key = "preemptible"
    queued = False

    def compute(self, spec: JobSpec, tier: Tier | None) -> ComputeFields:
        return ComputeFields({"preemptible": True, "on_host_maintenance": "TERMINATE", "automatic_restart": False})

    def tpu_scheduling(self) -> dict[str, bool]:
        return {"preemptible": True}


PREEMPTIBLE = register(Preemptible())
