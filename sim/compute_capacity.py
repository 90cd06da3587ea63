"""Whether Compute Engine has room for one more VM: its region's quota, its zone's capacity, or the reservation it
consumes; the refusal otherwise, as the operation's error carries it.

Capacity and quota refusals are decided when the request arrives and reported inside the operation, as the real
API does: ZONE_RESOURCE_POOL_EXHAUSTED with httpErrorStatusCode 503, QUOTA_EXCEEDED with 403.

Reservations (docs/gcp-facts.md §26): an insert whose reservationAffinity is SPECIFIC_RESERVATION consumes the
zone's specific reservation, whose size is the capacity timeline's "RESERVATION" steps for the zone and
accelerator (sim.set_capacity(..., provisioning_model="RESERVATION")): the sim holds one per zone and accelerator,
under the name (or the shared path, projects/OWNER/reservations/NAME) the insert gives. Such a VM is standard
provisioning (never preempted; host maintenance still stops it) and is charged to no quota (the reservation holds
it). A zone without such steps has no reservation: the insert is refused at once; a reservation whose VMs are all in
use (in-use: live instances consuming it) refuses in the operation, as Compute Engine does. A calendar-mode
reservation (set_reservation_end: it ends at a wall-clock time) is consumed by RESERVATION_BOUND VMs only (a STANDARD
one is refused, and RESERVATION_BOUND names a specific reservation); at its end each of its VMs gets its termination
action, as Compute's own stop or delete (never a preemption), and from then on the reservation no longer exists.
"""

from __future__ import annotations

import time

from sim.capacity import region_of
from sim.compute_instance import RESERVATION, RESERVATION_KEY, quota_metric, quota_model
from sim.core import compute_error
from sim.runtime import SimRuntime


class CapacityChecks:
    def __init__(self, rt: SimRuntime) -> None:
        self.rt = rt
        self.reservation_ends: dict[tuple[str, str], float] = {}  # (zone, accelerator) → a calendar reservation's end

    def refusal(self, zone: str, accelerator: str, model: str, machine_type: str, count: int,
                reservation: str = "") -> tuple[dict, tuple] | None:
        """A quota or capacity error for adding one node now, or None."""
        t = self.rt.now()
        if model == RESERVATION:
            return self._reservation_full(zone, accelerator, reservation, t)
        region = region_of(zone)
        pool = quota_model(model)
        limit, specific = self.rt.quota.limit(region, accelerator, pool, t)
        if limit is not None:
            used = self.rt.usage("quota", region, accelerator, pool if specific else None)
            if used + 1 > limit:
                metric = quota_metric(accelerator, model)
                message = f"Quota '{metric}' exceeded.  Limit: {float(limit)} in region {region}."
                return ({"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [
                    {"quotaInfo": {"metricName": f"compute.googleapis.com/{metric.lower()}", "limitName": f"{metric}-per-project-region",
                                   "dimensions": {"region": region}, "limit": float(limit)}},
                ]}, (403, "FORBIDDEN"))
        limit, specific = self.rt.capacity.limit(zone, accelerator, model, t)
        if limit is not None:
            used = self.rt.usage("capacity", zone, accelerator, model if specific else None)
            if used + 1 > limit:
                return self.stockout(zone, accelerator, machine_type, count)
        return None

    def reservation(self, zone: str, body: dict, accelerator: str) -> str:
        """The reservation a SPECIFIC_RESERVATION insert names, or the 400 Compute Engine answers when the zone has
        none of that name (gcp-facts §26: its message as clients match it; the status is unverified)."""
        affinity = body.get("reservationAffinity") or {}
        values = affinity.get("values") or []
        if affinity.get("key") != RESERVATION_KEY or len(values) != 1:
            raise compute_error(400, "invalid", "Invalid value for field 'resource.reservationAffinity': a "
                                f"SPECIFIC_RESERVATION affinity names one reservation under key {RESERVATION_KEY}")
        name = values[0]
        _, specific = self.rt.capacity.limit(zone, accelerator, RESERVATION, self.rt.now())
        if not specific or self.reservation_ends.get((zone, accelerator), float("inf")) <= time.time():
            raise compute_error(400, "invalid", f"Could not find the given reservation with the following name: "
                                                f"{name} in zone {zone}")
        return name

    def bound(self, zone: str, accelerator: str, requested: str | None, scheduling: dict) -> float | None:
        """A calendar-mode reservation's end (wall clock), for the RESERVATION_BOUND VM that consumes it; None for
        an ordinary reservation. The 400s for the wrong pairing are the sim's words (gcp-facts §26: Compute Engine
        refuses other provisioning models on these reservations; its message is unverified)."""
        ends_at = self.reservation_ends.get((zone, accelerator))
        if ends_at is not None and requested != "RESERVATION_BOUND":
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                f"'{requested or 'STANDARD'}'. A calendar-mode reservation is consumed by "
                                "RESERVATION_BOUND instances only")
        if ends_at is None and requested == "RESERVATION_BOUND":
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                "'RESERVATION_BOUND'. The reservation is not in calendar mode")
        if ends_at is not None and scheduling.get("instanceTerminationAction") not in ("STOP", "DELETE"):
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.instanceTerminationAction'"
                                ": a RESERVATION_BOUND instance needs STOP or DELETE, done at the reservation's end")
        return ends_at

    def _reservation_full(self, zone: str, accelerator: str, name: str, t: float) -> tuple[dict, tuple] | None:
        """The error of a reservation whose VMs are all in use, or None (gcp-facts §26: the message as clients match
        it; the code and HTTP status are unverified)."""
        limit, _ = self.rt.capacity.limit(zone, accelerator, RESERVATION, t)
        if limit is None or self.rt.usage("capacity", zone, accelerator, RESERVATION) + 1 <= limit:
            return None
        short = name.rsplit("/", 1)[-1]
        return ({"code": "RESERVATION_CAPACITY_EXCEEDED",
                 "message": f"Reservation {short} does not have sufficient capacity for the requested resources."},
                (503, "SERVICE UNAVAILABLE"))

    def stockout(self, zone: str, accelerator: str, machine_type: str, count: int) -> tuple[dict, tuple]:
        what = (f"A {machine_type} VM instance with {count} {accelerator} accelerator(s)" if count
                else f"A {machine_type} VM instance")
        message = (f"The zone 'projects/{self.rt.project}/zones/{zone}' does not have enough resources "
                   "available to fulfill the request.  Try a different zone, or try again later.")
        return ({"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message, "errorDetails": [
            {"errorInfo": {"reason": "resource_availability", "domain": "compute.googleapis.com",
                           "metadatas": {"zone": zone, "vmType": machine_type, "attachment": f"{accelerator}:{count}"}}},
            {"localizedMessage": {"locale": "en-US", "message": f"{what} is currently unavailable in the {zone} zone."}},
        ]}, (503, "SERVICE UNAVAILABLE"))
