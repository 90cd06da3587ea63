"""Flex-start VMs (Dynamic Workload Scheduler, provisioningModel FLEX_START; gcp-facts §18): a request waits for
capacity of its own pool (params.requestValidForDuration; unanswered, the platform deletes it), then the VM runs
unpreempted until its run duration ends (scheduling.maxRunDuration), when Compute Engine deletes it. That end is
known in advance: the node's agent acts on it as on a notice (node_agent/run_end.py, notice kind run-ending), and
the control plane reads the loss as a planned stop (RUN_ENDED), never a preemption. Preemptible quota."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from respawn.contract import NOTICE_RUN_ENDING
from respawn.control.models.base import RUN_ENDED, ComputeFields, Model, register
from respawn.schema import Heartbeat, JobSpec, MemberStatus, Tier

# A loss within this long of the run's end (its agent's notice aside) is the run's end: the deletion comes at the
# end as the platform counts it, which the control plane knows to a poll or so.
RUN_END_SLACK = timedelta(minutes=10)
# Losses of the job's own doing, which the run's end does not explain unless the agent said the end had come.
_OWN = ("trainer_crashed", "no_heartbeat")


class FlexStart(Model):
    name = label = "flex-start"
    strategy_name = "flex_start"
    capacity_pool = "flex-start"
    quota_pool = "preemptible"
    price_key = "flex-start"
    tpu = queued = False
    unanswered_cause = "flex_start_unanswered"

    def compute(self, spec: JobSpec, tier: Tier | None) -> ComputeFields:
        assert tier is not None, "a flex-start node is one of its job's tiers"
        run_seconds = round((tier.run_hours or 0) * 3600)
        scheduling = {"provisioning_model": "FLEX_START", "instance_termination_action": "DELETE",
                      "on_host_maintenance": "TERMINATE", "automatic_restart": False,
                      "max_run_duration": {"seconds": run_seconds}}
        # How long the request waits for capacity (params, not scheduling); never a reservation.
        extra = {"params": {"request_valid_for_duration": {"seconds": round(tier.request_valid_minutes * 60)}},
                 "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"}}
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

    def run_end_near(self, s: MemberStatus, hb: Heartbeat | None, now: datetime) -> bool:
        """Its agent said the run's end came (a notice it knows in advance), or the end is within RUN_END_SLACK."""
        if hb is not None and hb.notice == NOTICE_RUN_ENDING:
            return True
        return s.run_ends_at is not None and now >= s.run_ends_at - RUN_END_SLACK

    def loss_cause(self, cause: str, s: MemberStatus, hb: Heartbeat | None, now: datetime) -> str:
        """The run's end, whatever was observed of it (a deleted VM, a stale heartbeat after the agent's final one,
        a notice), unless the loss is the job's own and the agent did not say the end had come."""
        said = hb is not None and hb.notice == NOTICE_RUN_ENDING
        if said or (cause not in _OWN and self.run_end_near(s, hb, now)):
            return RUN_ENDED
        return cause


FLEX_START = register(FlexStart())
