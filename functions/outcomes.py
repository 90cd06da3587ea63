"""Outcomes of an action, recorded after it (pure as well): the after-action policy. reconcile._act performs the call
and classifies how it ended into an Outcome (placement.classify reads a raised exception); followup() says what that
means before the job is read again, after_act() what to commit on the status read then. Neither reads anything but
its arguments."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from respawn.images import IMAGE_MENTION, REQUEST_PREFIX, image_help
from respawn.schema import CapacityRecord, JobSpec, SlotStatus, State

from . import alerts, placement
from .actions import NONE, Act, Action, Decision, upd


class OutcomeKind(str, enum.Enum):
    """How a create/start/delete call ended."""

    DONE = "done"  # the call finished: created, started in place, deleted (or already gone: the adapters say so)
    EXISTS = "exists"  # the node is there already (409: a retried create): adopt it
    NOT_FOUND = "not_found"  # 404
    CAPACITY = "capacity"  # the zone cannot take the node now
    QUOTA = "quota"  # the project's quota for the accelerator in that region is used up
    FAILED = "failed"  # the request itself is wrong (bad machine type, permission): no other zone fixes it
    TRANSIENT = "transient"  # our dependency hiccuped (5xx, 429, network)


_OF_CLASS = {"capacity": OutcomeKind.CAPACITY, "quota": OutcomeKind.QUOTA, "exists": OutcomeKind.EXISTS,
             "not_found": OutcomeKind.NOT_FOUND, "fatal": OutcomeKind.FAILED, "transient": OutcomeKind.TRANSIENT}


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    code: str = ""  # the API's error code (e.g. ZONE_RESOURCE_POOL_EXHAUSTED), or the exception class
    message: str = ""

    @classmethod
    def of(cls, c: placement.Classified) -> "Outcome":
        """The outcome of a call that raised, from placement.classify(exc)."""
        return cls(_OF_CLASS[c.kind], c.code, c.message)


DONE = Outcome(OutcomeKind.DONE)
EXISTS = Outcome(OutcomeKind.EXISTS)


@dataclass(frozen=True)
class Followup:
    """What an action's outcome means before the job is read again."""

    propagate: bool = False  # re-raise the error: the platform redelivers, the redelivery resumes from what was recorded
    capacity: CapacityRecord | None = None  # the zone's refusal, for every job that asks for the same accelerator
    record: bool = False  # read the job again and commit after_act() on its status


def followup(spec: JobSpec | None, a: Action, out: Outcome, now: datetime) -> Followup:
    """For a delete: 404 is success, any other failure is retried by redelivery. For a create or a start: a
    transient failure is retried by redelivery; a capacity or quota refusal cools the zone down for every job (the
    spec's cooldown) and is recorded on the job; a start that meets 404 records nothing (the stopped node vanished
    meanwhile: the next pass observes it absent); every other outcome is recorded on the job (after_act)."""
    k = out.kind
    if a.kind is Act.DELETE:
        return Followup(propagate=k not in (OutcomeKind.DONE, OutcomeKind.NOT_FOUND))
    if a.kind not in (Act.CREATE, Act.START):
        raise ValueError(f"{a.kind.value} is not an action with an outcome")
    if k is OutcomeKind.TRANSIENT:
        return Followup(propagate=True)
    if k is OutcomeKind.NOT_FOUND and a.kind is Act.START:
        return Followup()
    if k is OutcomeKind.QUOTA and a.handover is not None:
        return Followup(record=True)  # the leaving node's own quota, most likely: no cooldown for every job
    if k in (OutcomeKind.CAPACITY, OutcomeKind.QUOTA):
        if spec is None or a.zone is None:
            raise ValueError("a refused create/start names its spec and zone")
        return Followup(record=True, capacity=CapacityRecord(
            zone=a.zone, accelerator_type=placement.accelerator_key(spec), reason=k.value, code=out.code,
            pools=placement.pools_refused(k.value, a.provisioning),  # a start names none: the node's own model
            message=out.message[:500], recorded_at=now, until=placement.cooldown_until(spec, now)))
    return Followup(record=True)


def after_act(job_id: str, s: SlotStatus, a: Action, out: Outcome, now: datetime) -> Decision:
    """What to record after action `a` ended with `out`, on the job's status `s` read after the action.

    Decision.status: commit it, conditional on `s` (None: nothing, e.g. a stale outcome: the job moved on);
    Decision.cause and .details: its lifecycle event (cause None: no event); Decision.alert: publish it once the
    status is committed; Decision.action: a follow-up to perform whatever the commit did (the delete of a node that a
    create made for a placement the job has left: never two live nodes).

    create/start done, or the node exists (409): the create (or the restart in place) is confirmed; a create whose
    job now names another node deletes the node it made. capacity/quota: the zone joins this round's refused zones
    (create) or the stopped node is given up for another zone (start: PREEMPTED). failed (or a create's 404): the job
    fails with the error, and a `failed` alert. A delete, a transient failure, a start's 404: nothing."""
    k = out.kind
    if a.kind is Act.DELETE or k is OutcomeKind.TRANSIENT or (k is OutcomeKind.NOT_FOUND and a.kind is Act.START):
        return Decision(NONE)
    if a.kind not in (Act.CREATE, Act.START) or a.attempt is None or a.node is None or a.zone is None:
        raise ValueError(f"{a.kind.value} is not a create or start with its zone, node and attempt")
    if k in (OutcomeKind.CAPACITY, OutcomeKind.QUOTA):
        new = (after_create_refused(s, a.attempt, a.zone, k.value, out.message, now) if a.kind is Act.CREATE
               else after_start_refused(s, a.attempt, a.zone, out.message, now))
        if new is None:
            return Decision(NONE)
        return Decision(NONE, new, f"zone_refused_{k.value}", details={"zone": a.zone, "code": out.code, "node": a.node})
    if k is OutcomeKind.DONE and a.kind is Act.START:
        return Decision(NONE, after_created(s, a.attempt, a.node, now))
    if k in (OutcomeKind.DONE, OutcomeKind.EXISTS):
        moved_on = s.node is not None and (s.node, s.zone) != (a.node, a.zone)
        made = Action(Act.DELETE, zone=a.zone, node=a.node, attempt=a.attempt) if moved_on else NONE
        return Decision(made, after_created(s, a.attempt, a.node, now))
    failed = after_create_failed(job_id, s, a.attempt, create_error(out), now)
    if failed is None:
        return Decision(NONE)
    return Decision(NONE, failed.status, failed.cause, failed.alert, {"code": out.code, "message": out.message[:500]})


def after_create_refused(s: SlotStatus, attempt: int, zone: str, kind: str, message: str, now: datetime) -> SlotStatus | None:
    """The create of `attempt` in `zone` was refused for capacity or quota: remember the zone for this round and
    count the failure. None when the status has moved on (a stale outcome)."""
    if s.attempt != attempt or s.zone != zone or s.create_state != "pending" or s.state is not State.PROVISIONING:
        return None
    if kind == "quota" and s.leaving is not None and s.leaving.until > now:
        # Created during a notice: the quota is likely the leaving node's own, free once it is off. Same zone then.
        return upd(s, now, create_state="failed", next_attempt_at=s.leaving.until,
                    message=f"{zone} refused {s.node} while {s.leaving.node} still holds its quota: {message}"[:1000])
    return upd(s, now, create_state="failed", consecutive_failures=s.consecutive_failures + 1,
                tried_zones=[*s.tried_zones, zone], message=f"{zone} refused {s.node} ({kind}): {message}"[:1000])


def after_start_refused(s: SlotStatus, attempt: int, zone: str, message: str, now: datetime) -> SlotStatus | None:
    """A restart in place was refused: the stopped node is deleted (PREEMPTED: the restart was already counted)
    and the replacement goes to another zone of the list."""
    if s.attempt != attempt or s.zone != zone or s.state is not State.PROVISIONING:
        return None
    return upd(s, now, state=State.PREEMPTED, tried_zones=[*s.tried_zones, zone],
                consecutive_failures=s.consecutive_failures + 1,
                message=f"{zone} refused to restart {s.node} in place: {message}"[:1000])


def after_create_failed(job_id: str, s: SlotStatus, attempt: int, message: str, now: datetime) -> Decision | None:
    """A create failed for a reason no zone change fixes (bad machine type, permission): the job fails."""
    if s.attempt != attempt or s.state.terminal:
        return None
    msg = f"creating {s.node} in {s.zone} failed: {message}"[:1000]
    st = upd(s, now, state=State.FAILED, message=msg, recovering=False)
    return Decision(NONE, st, "create_failed", alerts.told("failed", job_id, now, said=msg, restarts=s.restarts,
                                                          attempt=attempt, cause="create_failed"))


def after_created(s: SlotStatus, attempt: int, node: str, now: datetime) -> SlotStatus | None:
    """The create of `attempt` finished (or met 409 and adopted the node), or its restart in place did."""
    if s.attempt != attempt or s.node != node or s.create_state not in ("pending", "starting"):
        return None
    return upd(s, now, create_state="created")


def create_error(out: Outcome) -> str:
    """The failure a create/start that no other zone can fix records; a 404 naming an image says how to find one."""
    m = IMAGE_MENTION.search(out.message) if out.kind is OutcomeKind.NOT_FOUND else None
    if m is None:
        return f"{out.code}: {out.message}"
    return f"{out.code}: {REQUEST_PREFIX.sub('', out.message)}. {image_help(m.group(0))}"
