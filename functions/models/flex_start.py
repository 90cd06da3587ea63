"""Flex-start VMs (Dynamic Workload Scheduler, provisioningModel FLEX_START; gcp-facts §18): a request waits for
capacity of its own pool (params.requestValidForDuration; unanswered, the platform deletes it), then the VM runs
unpreempted until its run duration ends (scheduling.maxRunDuration), when Compute Engine deletes it. That end is
known in advance: the node's agent acts on it as on a notice (node_agent/run_end.py, notice kind run-ending), and
the control plane reads the loss as a planned stop (models.base: run_end_near, loss_cause), never a preemption.
Preemptible quota."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from respawn.schema import JobSpec, MemberStatus, Tier

from .base import ComputeFields, Model, register


class FlexStart(Model):
    name = label = "flex-start"
    strategy_name = "flex_start"
    capacity_pool = "flex-start"
    quota_pool = "preemptible"
    price_key = "flex-start"
    tpu = queued = False
    unanswered_cause = "flex_start_unanswered"
    insert_waits_for_capacity = True

    def compute(self, spec: JobSpec, tier: Tier | None) -> ComputeFields:
        assert tier is not None, "a flex-start node is one of its job's tiers"
        run_seconds = round((tier.run_hours or 0) * 3600)
        scheduling = {"provisioning_model": "FLEX_START", "instance_termination_action": "DELETE",
                      "on_host_maintenance": "TERMINATE", "automatic_restart": False,
                      "max_run_duration": {"seconds": run_seconds}}
        # How long the request waits for capacity (params, not scheduling).
        extra = {"params": {"request_valid_for_duration": {"seconds": round(tier.request_valid_minutes * 60)}}}
        return ComputeFields(scheduling, extra, run_seconds)

    def on_running(self, tier: Tier | None, now: datetime) -> dict[str, Any]:
        """Its life counts from now (its request may have waited long for capacity: not against the boot grace),
        and its run ends max_run_hours later."""
        if tier is None or tier.run_hours is None:
            return {}
        return {"node_started_at": now, "run_ends_at": now + timedelta(hours=tier.run_hours)}

    def unanswered(self, s: MemberStatus, tier: Tier | None) -> str | None:
        wait = tier.request_valid_minutes if tier is not None else None
        return f"{s.zone} found no flex-start capacity for {s.node}" + (f" within {wait:g} min" if wait else "")


FLEX_START = register(FlexStart())
