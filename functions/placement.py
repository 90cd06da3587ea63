"""Placement policy: what a failed create means, how long a refusing zone cools down, how long to wait when every
zone refused (the next node's zone and model are the job's recovery strategy's: recovery.py). Pure: no cloud library
is imported; exceptions are read by their shape (google.api_core exceptions carry `.code` (HTTP status), `.errors`,
`.message`; Compute errors are proto messages or dicts with a `code`/`reason`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Mapping, Sequence

from respawn.advice import ZoneAdvice, shape_of
from respawn.schema import JobSpec, SlotStatus

from . import models

Kind = Literal["capacity", "quota", "exists", "not_found", "fatal", "transient"]

# Compute Engine operation error codes (gcp-facts §4) meaning "this zone cannot take the node now".
CAPACITY_CODES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "REGION_RESOURCE_POOL_EXHAUSTED",
    "GPU_STOCKOUT", "INSUFFICIENTCAPACITY", "UNSUPPORTED_OPERATION", "RESOURCE_NOT_FOUND",
    "RESOURCE_OPERATION_RATE_EXCEEDED", "RESOURCE_AVAILABILITY", "STOCKOUT",
}
QUOTA_CODES = {"QUOTA_EXCEEDED", "QUOTAEXCEEDED"}
# A project's API rate quota (requests per minute), not a zone's resources (gcp-facts §4): Compute answers 403
# `rateLimitExceeded`, other APIs 429 with ErrorInfo reason `RATE_LIMIT_EXCEEDED`. It refills within a minute, so it
# is transient (the platform redelivers with backoff) and never cools a zone down. Compared without "_", upper case.
RATE_LIMIT_CODES = {"RATELIMITEXCEEDED", "USERRATELIMITEXCEEDED"}
# google.rpc UNAVAILABLE's message (Cloud TPU answers a 503 with it): "currently unavailable" below is a stockout's
# phrase only in Compute Engine's "... is currently unavailable in zone ..." messages.
SERVICE_UNAVAILABLE = "the service is currently unavailable"
CAPACITY_PHRASES = (
    "does not have enough resources", "no more capacity", "stockout", "resource_availability",
    "insufficient reserved capacity", "currently unavailable", "resource pool exhausted",
    # Cloud TPU, a Spot node preempted while it was being created (INVALID_ARGUMENT, gcp-facts §15): the zone took
    # the capacity back, so another zone is tried; the PREEMPTED node is deleted like any preempted TPU.
    "while in state preempted",
)
QUOTA_PHRASES = ("quota", "exhausted. limit")


@dataclass(frozen=True)
class Classified:
    kind: Kind
    code: str
    message: str


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def _codes(exc: BaseException) -> list[str]:
    codes = []
    for item in getattr(exc, "errors", None) or []:
        for name in ("code", "reason"):
            value = _field(item, name)
            if isinstance(value, str) and value:
                codes.append(value)
    return codes


def classify(exc: BaseException) -> Classified:
    """What a failed create/start means for placement.

    capacity / quota: skip the zone for a cooldown. exists: the node is already there (a retried create): adopt it.
    fatal: the request itself is wrong (bad machine type, permission): the job fails with the message.
    transient: our dependency hiccuped, or the project's API rate quota ran out: raise so the platform retries the
    delivery.
    """
    message = str(getattr(exc, "message", None) or exc)
    codes = _codes(exc)
    upper = {c.upper() for c in codes}
    lower = message.lower()
    http = getattr(exc, "code", None)
    http = http if isinstance(http, int) else None
    first = codes[0] if codes else (type(exc).__name__)
    info_reason = getattr(exc, "reason", None)  # google.rpc.ErrorInfo.reason (gRPC details, REST error.details)
    reasons = codes + ([info_reason] if isinstance(info_reason, str) else [])
    rate_limited = [c for c in reasons if c.upper().replace("_", "") in RATE_LIMIT_CODES]
    if rate_limited:  # checked first: its message reads "Quota exceeded for quota metric …" and its HTTP code is 403
        return Classified("transient", rate_limited[0], message)
    if upper & QUOTA_CODES:
        return Classified("quota", next(c for c in codes if c.upper() in QUOTA_CODES), message)
    if upper & CAPACITY_CODES:
        return Classified("capacity", next(c for c in codes if c.upper() in CAPACITY_CODES), message)
    said = [str(_field(i, "message") or "") for i in getattr(exc, "errors", None) or []]
    pool = next((m for m in [message, *said] if any(p in m.lower() for p in models.capacity_phrases())), None)
    if pool is not None:  # a model's own pool used up (a full reservation), in the error's own words
        return Classified("capacity", first, pool)
    if http == 409 or type(exc).__name__ in ("Conflict", "AlreadyExists") or "already exists" in lower:
        return Classified("exists", first, message)
    if http == 404:
        return Classified("not_found", first, message)
    # Cloud TPU (google.longrunning → gRPC status): RESOURCE_EXHAUSTED (HTTP 429) is a stockout or a quota,
    # FAILED_PRECONDITION "Insufficient reserved capacity" is capacity.
    if any(p in lower for p in QUOTA_PHRASES) and (http in (403, 429) or type(exc).__name__ in ("Forbidden", "ResourceExhausted", "TooManyRequests")):
        return Classified("quota", first, message)
    if SERVICE_UNAVAILABLE in lower:  # any API's 503 in gRPC's own words, not a zone's stockout: retried
        return Classified("transient", first, message)
    if any(p in lower for p in CAPACITY_PHRASES):
        return Classified("capacity", first, message)
    if type(exc).__name__ == "ResourceExhausted":
        return Classified("capacity", "RESOURCE_EXHAUSTED", message)
    if http is not None and (http >= 500 or http == 429):
        return Classified("transient", first, message)
    if http is not None and 400 <= http < 500:
        return Classified("fatal", first, message)
    return Classified("transient", first, message)


def pools_refused(reason: Literal["capacity", "quota"], model: str) -> list[str]:
    """The capacity pools a refusal of a `model` node cools down: its own (each model's capacity_pool: Spot and
    preemptible VMs share the zone's spare capacity, flex-start, on-demand and a reservation have pools of their
    own, so a Spot stockout does not keep a job's next tier out of the zone), or for quota every pool on its quota
    (gcp-facts §18, §21)."""
    m = models.of(model)
    if reason == "quota":
        return sorted({o.capacity_pool for o in models.all_models() if o.quota_pool == m.quota_pool})
    return [m.capacity_pool]


def pool_key(zone: str, pool: str) -> str:
    """A cooldown's key in Observation.blocked when it holds for one capacity pool; a bare zone holds for all."""
    return f"{zone}~{pool}"


def cooldowns(blocked: Mapping[str, datetime], model: str) -> dict[str, datetime]:
    """zone → the end of its cooldown for a `model` node: the later of the zone's for every pool (a record of an
    older version) and its pool's own."""
    out: dict[str, datetime] = {}
    suffix = pool_key("", models.of(model).capacity_pool)
    for key, until in blocked.items():
        zone, sep, _ = key.partition("~")
        if not sep or key.endswith(suffix):
            out[zone] = max(until, out.get(zone, until))
    return out


def backoff(spec: JobSpec, status: SlotStatus, blocked: Mapping[str, datetime], now: datetime, base_seconds: float,
            zones: Sequence[str] | None = None) -> datetime:
    """When to try again after every zone refused: exponential in the consecutive failures, capped by the spec;
    when zones (`zones`: the slot's, by default the job's) are under a cooldown, not before the first one ends
    (nothing could succeed earlier), within the cap."""
    cap = spec.placement.max_backoff_seconds
    exp = min(cap, base_seconds * (2 ** min(max(status.consecutive_failures - 1, 0), 20)))
    walked = spec.zones if zones is None else zones
    ends = [until for zone, until in blocked.items() if zone in walked and until > now]
    if ends:
        exp = max(exp, min(cap, (min(ends) - now).total_seconds()))
    return now + timedelta(seconds=exp)


def cooldown_until(spec: JobSpec, now: datetime) -> datetime:
    return now + timedelta(seconds=spec.placement.cooldown_seconds)


def accelerator_key(spec: JobSpec) -> str:
    """The accelerator a capacity record is about: the GPU type (or the machine type for built-in GPUs) or the TPU
    type, so one job's stockout steers every job that asks for the same thing."""
    shape = shape_of(spec.accelerator)
    return shape.capacity_key if shape is not None else spec.accelerator.accelerator_type


def rank_zones(zones: Sequence[str], advice: Mapping[str, ZoneAdvice]) -> list[str]:
    """The user's zones by capacity advice (placement.rank: advice): the most obtainable first, then the longest
    estimated uptime (unknown counts as none), the user's order between equals. Never a zone the user did not list;
    the user's order as it is unless every zone has advice (a zone unscored cannot be placed among the others)."""
    if not zones or any(z not in advice for z in zones):
        return list(zones)
    order = {z: i for i, z in enumerate(zones)}
    return sorted(zones, key=lambda z: (-advice[z].obtainability, -(advice[z].uptime_seconds or 0.0), order[z]))
