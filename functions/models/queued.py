"""Cloud TPU queued resources, the pure part (issue #26 item 2; gcp-facts §19): which jobs use one, how a request's
state reads as a node's, and when a request has waited longer than its job allows.

A job that uses queued resources asks for each node through a request of the node's own name (`{job}-{attempt}`,
the request's id and its one node's id), so the slot's status, the orphan scan and the events name both alike.
`NodeProvider.get` (adapters/tpu.QueuedTpuProvider) reports the request's state, prefixed with PREFIX so that no
node state of the same name (CREATING, DELETING) is taken for it, until the request is ACTIVE; then the node's own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from respawn.schema import JobSpec, MemberStatus
from respawn.topology import tpu_hosts

from . import base

PROVIDER = "tpu-queued"  # its key in reconcile.Deps.providers (beside "gpu" and "tpu")
PREFIX = "queued:"
# Waiting for capacity: the wait counts against the job's queue_wait_minutes. ACCEPTED is the older name of
# WAITING_FOR_RESOURCES (gcp-facts §19).
WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES")
FAILED = "FAILED"  # the wait ran out (valid_until_duration) or a late-found problem: the zone did not serve it
SUSPENDED = ("SUSPENDING", "SUSPENDED")  # its node was taken (a Spot preemption) or deleted: never queued again
# A request's state, until it is ACTIVE, as an observation.Phase name. PROVISIONING and ACTIVE: its node is being made
# (ACTIVE before the node shows). FAILED, SUSPENDED: it holds quota and never serves again: deleted. SUSPENDING:
# its node is being taken.
PHASES = {
    "CREATING": "BOOTING", "ACCEPTED": "BOOTING", "WAITING_FOR_RESOURCES": "BOOTING", "PROVISIONING": "BOOTING",
    "ACTIVE": "BOOTING", "FAILED": "DEAD", "SUSPENDING": "STOPPING", "SUSPENDED": "DEAD", "DELETING": "DELETING",
}


def enabled(spec: JobSpec | None) -> bool:
    """Whether the job's node is obtained through a queued resource: accelerator.queued_resource, by default for a
    multi-host TPU slice (as large slices are obtained in practice) unless a tier's model has no queued-resource
    tier (preemptible: a queued resource's tiers are spot and guaranteed)."""
    if spec is None or spec.accelerator.kind != "tpu":
        return False
    if spec.accelerator.queued_resource is not None:
        return spec.accelerator.queued_resource
    if any(not base.of(t.model).queued for t in spec.provisioning_tiers):
        return False
    try:
        return tpu_hosts(spec.accelerator.accelerator_type) > 1
    except ValueError:  # a type this version does not size: created directly, as before
        return False


def provider_key(spec: JobSpec | None) -> str:
    """The key of the provider that makes the job's nodes (reconcile.Deps.providers)."""
    if spec is None:
        return "gpu"
    return PROVIDER if enabled(spec) else spec.accelerator.kind


def raw(state: str) -> str:
    """A request's state as NodeProvider.get reports it."""
    return PREFIX + state


def state_of(raw_state: str | None) -> str | None:
    """The request's state in a reported state, or None when it is a node's (or nothing)."""
    if raw_state is None or not raw_state.upper().startswith(PREFIX.upper()):
        return None
    return raw_state[len(PREFIX):].upper()


def refusal(spec: JobSpec, s: MemberStatus, raw_state: str | None, now: datetime) -> str | None:
    """Why the zone did not serve the slot's request, as the status message says it; None while it may still.
    FAILED (its valid_until_duration ran out, or Cloud TPU found a problem), or waiting longer than
    accelerator.queue_wait_minutes since the request was committed (a backstop beside the request's own limit)."""
    state = state_of(raw_state)
    if state == FAILED:
        return f"{s.zone} did not provide {s.node}: its queued resource FAILED"
    if state in WAITING and s.node_started_at is not None:
        limit = spec.accelerator.queue_wait_seconds  # type: ignore[union-attr]  # a TPU spec: enabled(spec)
        if (now - s.node_started_at).total_seconds() > limit:
            return f"{s.zone} had no capacity for {s.node} within {limit / 60:g} min (queued resource {state})"
    return None


class Queued(base.Obtaining):
    """The Cloud TPU queued resource as the way a TPU node is obtained (base.Obtaining)."""

    refused_cause = "zone_refused_queued"

    def used_by(self, spec: JobSpec | None) -> bool:
        return enabled(spec)

    def request_state(self, raw: str | None) -> str | None:
        return state_of(raw)

    def phase(self, raw: str | None) -> str | None:
        request = state_of(raw)
        return None if request is None else PHASES.get(request, "UNKNOWN")

    def refusal(self, spec: JobSpec, s: MemberStatus, raw: str | None, now: datetime) -> str | None:
        return refusal(spec, s, raw, now)

    def lost_cause(self, raw: str | None) -> str | None:
        """SUSPENDING/SUSPENDED: its Spot node was taken (a preemption); FAILED: queued_resource_failed."""
        request = state_of(raw)
        if request is None:
            return None
        return "preempted" if request in SUSPENDED else f"queued_resource_{request.lower()}"

    def on_running(self, now: datetime) -> dict[str, Any]:
        return {"node_started_at": now}  # its request may have waited long: the boot grace counts from now


QUEUED = base.register_way(Queued())
