"""A decision's vocabulary (pure): the one action it asks for (`Act`, `Action`) and the `Decision` itself (that action,
the status to commit before it, its event and alert). Shared by the decision (functions/decide.py, functions/job.py)
and the after-action policy (functions/outcomes.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from respawn.contract import Handover
from respawn.schema import JobStatus, SlotStatus


class Act(str, enum.Enum):
    NONE = "none"
    CREATE = "create"  # create node `node` in `zone` (attempt `attempt`, model `provisioning`); 409 → adopt
    START = "start"  # start the stopped node in place
    DELETE = "delete"  # delete the node; 404 is success
    POLL = "poll"  # a transition is under way: look again shortly (within this invocation's budget)
    WAIT = "wait"  # nothing to do before `until` (the sweep comes back)


@dataclass(frozen=True)
class Action:
    kind: Act
    zone: str | None = None
    node: str | None = None
    attempt: int | None = None
    provisioning: str | None = None
    until: datetime | None = None
    slot: int | None = None  # the member slot acted on (a job of several nodes); None: the job's one node
    handover: Handover | None = None  # a create during a notice: the node it replaces, still saving (ATTR_HANDOVER)


NONE = Action(Act.NONE)
POLL = Action(Act.POLL)


@dataclass(frozen=True)
class Decision:
    action: Action
    status: SlotStatus | JobStatus | None = None  # to commit before acting; None: unchanged
    cause: str | None = None  # the event cause when the state changes
    alert: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)


def upd(s: SlotStatus, now: datetime, **changes: Any) -> SlotStatus:
    """`s` with `changes`, as a decision commits it: stamped `now`, its revision the next."""
    return s.model_copy(update={**changes, "updated_at": now, "revision": s.revision + 1})
