"""A recovery, told once (docs/watching.md): its time, from the notice until every rank steps again, and the steps
it lost; and the one vocabulary of loss causes. Pure: no I/O, no clock.

- The notice: when Respawn learned the node was going: the agent's notice message, the audit log's event, or the
  controller seeing the node lost, whichever came first (a hard kill has no notice: its detection starts the clock).
  It is the loss's `preempted_at` in the job's status.
- Every rank stepping again: the last rank's first step of the resumed run, as its agent saw it (each heartbeat's
  `first_step_at`, the first step past the restored one: node_agent/reach.py; a single node, every worker of a TPU
  slice, every member of a generation).
- Steps lost: the furthest step reached before the resume minus the step the resumed run restored (its committed
  step when it first stepped): taken after the notice's emergency commit, so a step it kept is not lost.

The decision core measures it (`measure`) when the job steps again (decide._healthy for one node, job._recovered
for several; the agent wakes the controller at a trainer's first step), and the `recovered` alert and event carry
it (`Recovery.fields`; the `succeeded` ones when the run finished before a reconcile saw it step: `told`); Slack, `respawn jobs
describe/events/report`, `respawn chaos` and the demo's summary and live view read it from there (`read`, `text`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

from respawn.schema import Heartbeat

from . import models

# The one vocabulary of loss causes (a loss event's cause, an alert's `cause`, the status's last_cause): the same
# fault gives the same cause however Respawn learned of it. The platform taking a node reads as a Spot preemption
# on the audit log, a TERMINATED or PREEMPTED state on a poll, a gone node, the agent's notice: all one `preempted`
# (the signal it came by is kept in the loss event's details, `signal`). The job's own faults keep their names.
PREEMPTED = "preempted"  # the platform took the node: Spot/preemptible preemption, host error, maintenance, stopped,
# deleted or gone from outside
RUN_ENDED = models.RUN_ENDED  # a run ended as its model planned (a flex-start VM's max run duration)
NO_HEARTBEAT = "no_heartbeat"  # a boot whose agent never reported
FAILURES = ("trainer_crashed", "stale_heartbeat", "unreachable")  # the job's own (losses.FAILURE_CAUSES)


def loss_cause(signal: str, noticed: bool = False) -> str:
    """The cause a loss is told by, from the signal it came by (decide._lose), as losses.loss_kind counts it: a
    failure's signal after the agent saw a notice (`noticed`) is the platform's doing. A request that failed
    (queued_resource_failed: functions/models/queued.py) is no node taken, and keeps its own name."""
    if signal in (RUN_ENDED, NO_HEARTBEAT) or signal.startswith("queued_resource_"):
        return signal
    if signal in FAILURES and not noticed:
        return signal
    return PREEMPTED


@dataclass(frozen=True)
class Recovery:
    cause: str | None
    notice_at: datetime
    stepping_at: datetime  # every rank stepping again
    furthest_step: int | None  # the furthest step reached before the resume
    resumed_from: int | None  # the step the resumed run restored

    @property
    def seconds(self) -> float:
        return round(max((self.stepping_at - self.notice_at).total_seconds(), 0.0), 1)

    @property
    def steps_lost(self) -> int | None:
        if self.furthest_step is None or self.resumed_from is None:
            return None
        return max(self.furthest_step - self.resumed_from, 0)

    def fields(self) -> dict[str, Any]:
        """What the `recovered` alert and event carry (times as RFC 3339 text; the loss's cause as `loss_cause`, the
        event's own cause being `recovered`)."""
        return {"recovery_seconds": self.seconds, "notice_at": self.notice_at.isoformat(),
                "stepping_at": self.stepping_at.isoformat(), "steps_lost": self.steps_lost,
                "furthest_step": self.furthest_step, "resumed_from": self.resumed_from, "loss_cause": self.cause}


def resumed_run(hb: Heartbeat, recovering: bool, notice_at: datetime | None) -> bool:
    """The beat is of the resumed run (a trainer started after the notice of the recovery under way): its steps are
    not the furthest step before the resume, which the job's last_step keeps until the recovery is measured."""
    return recovering and notice_at is not None and hb.started_at is not None and hb.started_at >= notice_at


def _stepped(hb: Heartbeat) -> tuple[datetime, int] | None:
    """(when this rank first stepped in its run, the step it resumed from), or None before it stepped. Its agent's
    first step is the first past the step its trainer restored (node_agent/reach.py), so the run resumed from the
    step before it, or from the committed step it reports when that is older (a first step seen a few steps late)."""
    if hb.first_step_at is None or hb.first_step is None:
        return None
    resumed = hb.first_step - 1 if hb.committed_step is None else min(hb.committed_step, hb.first_step - 1)
    return hb.first_step_at, max(resumed, 0)


def measure(cause: str | None, notice_at: datetime | None, furthest_step: int | None,
            ranks: Sequence[Heartbeat]) -> Recovery | None:
    """The recovery once every rank of the resumed run (`ranks`: each one's heartbeat) has stepped; None before, or
    without a notice time. `furthest_step`: the furthest step the job's record holds from before the resume."""
    if notice_at is None or not ranks:
        return None
    stepped = [_stepped(hb) for hb in ranks]
    if any(x is None for x in stepped):
        return None
    at = max(t for t, _ in stepped)  # type: ignore[misc]
    resumed = min(r for _, r in stepped)  # type: ignore[misc]
    furthest = max(furthest_step, resumed) if furthest_step is not None else None
    return Recovery(cause, notice_at, max(at, notice_at), furthest, resumed)


# A recovery's stages in order, each ended by a moment the record keeps (the last by every rank stepping again), and
# their words: the `recovered` alert's breakdown and the report's (decide.recovery_stages measures them).
STAGES = {"waiting_for_capacity": "waiting for capacity", "vm_create_and_boot": "VM create and boot",
          "setup": "agent and setup", "restore_and_first_step": "trainer start, restore and first step"}


def stages(notice_at: datetime | None, ends: Sequence[tuple[str, datetime | None]],
           stepping_at: datetime) -> dict[str, float]:
    """Where a recovery's time went: stage → seconds, in order, adding up to its time (Recovery.seconds) exactly.
    `ends`: each stage before the last and the moment it ended (None: unknown); the last, restore_and_first_step,
    ends when every rank steps again. A stage whose end is unknown, or not after the previous end, is folded into the
    next one rather than dropped, and the ends are rounded to the tenth on the clock from the notice before they are
    subtracted: so the parts always sum to the rounded total (a breakdown that drops a part misleads)."""
    if notice_at is None:
        return {}
    total = round(max((stepping_at - notice_at).total_seconds(), 0.0) * 10)  # tenths, as Recovery.seconds rounds
    out: dict[str, float] = {}
    before = 0
    for stage, end in [*ends, ("restore_and_first_step", stepping_at)]:
        if end is None:
            continue
        at = min(round((end - notice_at).total_seconds() * 10), total)
        if at <= before and stage != "restore_and_first_step":
            continue
        out[stage] = max(at - before, 0) / 10
        before = max(at, before)
    return out


def breakdown(cause: str | None, parts: Mapping[str, float], seconds: float) -> str:
    """'this preemption cost 9.2 s: 1.2 s waiting for capacity, 0.4 s VM create and boot, …': the recovery's time
    (the figure every renderer shows), then every stage that took any time, so the parts add up to it."""
    what = {PREEMPTED: "preemption", RUN_ENDED: "planned stop"}.get(cause or "", "loss")
    said = [f"{text(v)} {STAGES.get(k, k)}" for k, v in parts.items() if v > 0]
    return f"this {what} cost {text(seconds)}" + (": " + ", ".join(said) if said else "")


def told(cause: str, details: Mapping[str, Any]) -> bool:
    """An event (or alert) that tells a recovery: `recovered`, or the job's end when its last run stepped and
    finished before a reconcile said so (its `trainer_succeeded` then carries the figure)."""
    return cause == "recovered" or "recovery_seconds" in details


def read(details: Mapping[str, Any]) -> Recovery | None:
    """A recovery back from what a `recovered` alert or event carries (None: an older one without it)."""
    try:
        return Recovery(details.get("loss_cause"), _time(details["notice_at"]), _time(details["stepping_at"]),
                        details.get("furthest_step"), details.get("resumed_from"))
    except (KeyError, TypeError, ValueError):
        return None


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def text(seconds: float | None) -> str:
    """A recovery time as every renderer shows it: '9.8 s'."""
    return "unknown" if seconds is None else f"{seconds:.1f} s"


def line(details: Mapping[str, Any]) -> str:
    """'recovered in 9.8 s (notice → every rank stepping), 0 steps lost (preempted)': a `recovered` event's words."""
    r = read(details)
    if r is None:
        return "recovered"
    lost = "steps lost unknown" if r.steps_lost is None else f"{r.steps_lost} steps lost"
    return f"recovered in {text(r.seconds)} (notice → every rank stepping), {lost}" + (
        f" ({r.cause})" if r.cause else "")
