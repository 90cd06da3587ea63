"""Reserved capacity: a VM that consumes a specific Compute Engine reservation (gcp-facts §26). The reservation
holds capacity in one zone for VMs of its machine type; a VM names it in reservationAffinity
(consumeReservationType SPECIFIC_RESERVATION, key compute.googleapis.com/reservation-name, values [NAME], or
projects/OWNER/reservations/NAME for a reservation another project shares). Such a VM is standard provisioning:
never preempted, but host maintenance stops a GPU VM (onHostMaintenance TERMINATE) like any on-demand one. A
reservation whose VMs are all in use refuses the next one: a refusal of this pool alone, so "my reservation first,
Spot when it is full" moves on to the next tier, and "Spot first, my reservation when Spot is dry" reaches it after
Spot's refusals.

A future reservation in calendar mode or in AI Hypercomputer creates, at its start, a reservation that ends at a set
time (the tier's ends_at): its VMs are reservation-bound (provisioningModel RESERVATION_BOUND, with automatic restart
and the termination action DELETE at the reservation's end; gcp-facts §26), and Compute Engine refuses a STANDARD VM
on it. Its end is known in advance, as a flex-start run's is: the agent acts on it as on a notice (the node's
ATTR_RUN_ENDS_AT), the loss at the end is a planned stop (models.base), and from the end on the tier is passed over
(recovery.Strategy.tier).

Billing: reserved resources are billed at the on-demand rate whether a VM uses them or not (a committed-use
discount aside); the ledger prices a reservation VM at the on-demand rate, an upper bound.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from respawn.schema import JobSpec, Tier

from .base import ComputeFields, Model, register

AFFINITY_KEY = "compute.googleapis.com/reservation-name"


class Reservation(Model):
    name = label = strategy_name = "reservation"
    capacity_pool = "reservation"  # the reservation's own VMs: a full one says nothing of the zone's spare capacity
    quota_pool = "reservation"  # the reservation holds its quota already
    price_key = "standard"
    lasting = True  # never preempted (host maintenance aside, as on-demand)
    tpu = queued = False
    # What Compute Engine answers when the named reservation has no VM left (gcp-facts §26).
    capacity_phrases = ("does not have sufficient capacity for the requested resources",)

    def compute(self, spec: JobSpec, tier: Tier | None) -> ComputeFields:
        assert tier is not None and tier.reservation, "a reservation node is one of its job's tiers, named"
        affinity = {"reservation_affinity": {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": AFFINITY_KEY,
                                             "values": [tier.reservation]}}
        if tier.ends_at is None:
            return ComputeFields(
                {"provisioning_model": "STANDARD", "on_host_maintenance": "TERMINATE", "automatic_restart": False},
                affinity)
        # Google's reservation-bound VMs: deleted at the reservation's end; automatic restart as its examples set it.
        return ComputeFields({"provisioning_model": "RESERVATION_BOUND", "instance_termination_action": "DELETE",
                              "on_host_maintenance": "TERMINATE", "automatic_restart": True},
                             affinity, run_ends_at=tier.ends_at)

    def on_running(self, tier: Tier | None, now: datetime) -> dict[str, Any]:
        """A reservation-bound node's run ends with its reservation."""
        return {"run_ends_at": tier.ends_at} if tier is not None and tier.ends_at is not None else {}

    def zones(self, tier: Tier, zones: list[str]) -> list[str]:
        """The reservation's zone alone (a reservation is zonal), while the job may go there (a job of several nodes
        that holds another zone cannot)."""
        return [z for z in zones if z == tier.zone] if tier.zone else list(zones)


RESERVATION = register(Reservation())
