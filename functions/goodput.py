"""Where a job's time went, from what Respawn records without user code: its lifecycle events and the last heartbeat
of each of its nodes. Pure: the controller's Cloud Monitoring series (goodput_metrics.py, adapters/monitoring.py) and
the CLI's report page (respawn/app/report.py) both read it.

A life is one node of one member slot, from the create the controller decided (an event whose details name the node
and its provisioning model) to the next create in that slot (the controller learned the node was lost, or its notice
came), or the job's end. A refused create is no life. The node's heartbeat says when its trainer started, its first
step (and when the agent saw it), its last step and committed step.

Goodput buckets, named after ml-goodput-measurement's badput types (docs/watching.md; the report page says them in
a user's words: respawn.app.report.BUCKET_WORDS), partition the job's wall time, registration to its end (or now), along
the lives of slot 0 (the job's master: any member's loss stops every rank, and the master's lives follow every
recovery of the world):
- productive_training: stepping, for the steps that were kept;
- wasted_progress_from_disruption: stepping, for the steps after the life's last committed checkpoint (redone);
- infrastructure_recovery_from_disruption: after a loss, until the replacement VM runs (capacity, create, boot);
- program_startup: the job's first VM, from registration until it runs, and every VM from running until its
  trainer starts (agent, workdir, setup or the environment cache);
- training_prep: trainer start until its first step (interpreter, framework, restore);
- other: what is left (a node that never reported, a life cut short before it stepped, the end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from respawn.schema import Heartbeat, JobEvent, JobStatus, State

from . import recovery_time

BUCKETS = ("productive_training", "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption",
           "program_startup", "training_prep", "other")
# A life ended by the job's end (its state, lower case), not by a loss.
ENDS = {s.value.lower() for s in State if s.terminal}


@dataclass
class Life:
    """One run of a node: a VM from its create (or its restart in place) until it was lost or the job ended, and
    what its trainer did, as the node's heartbeat said (its last heartbeat for the node's newest run, the loss
    event's `lost` for an earlier one: losses.lost_life)."""

    slot: int
    node: str
    attempt: int
    zone: str
    model: str  # spot, preemptible, flex-start, standard
    created_at: datetime
    running_at: datetime | None = None
    ended_at: datetime | None = None  # None: still the slot's node
    end_cause: str = ""  # why the next node was made (preempted, run_ended, …) or how the job ended
    trainer_started_at: datetime | None = None
    first_step: int | None = None
    first_step_at: datetime | None = None
    step: int | None = None  # the last step reported, at last_beat_at
    committed_step: int | None = None
    last_beat_at: datetime | None = None

    @property
    def stepped(self) -> bool:
        return None not in (self.first_step, self.first_step_at, self.step, self.last_beat_at)

    def said(self, beat: Any) -> None:
        """Take what a heartbeat (schema.Heartbeat) or a loss event's `lost` (a dict) said of this run's trainer."""
        get = beat.get if isinstance(beat, dict) else lambda key: getattr(beat, key, None)
        self.trainer_started_at = _time(get("started_at"))
        self.first_step, self.first_step_at = get("first_step"), _time(get("first_step_at"))
        self.step, self.committed_step = get("step"), get("committed_step")
        self.last_beat_at = _time(get("heartbeat_at"))


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


@dataclass
class Recovery:
    """One recovery as the controller measured it (its `recovered` event: recovery_time), with the first node it
    replaced; a loss not recovered (yet) has no `training_at`."""

    slot: int
    lost: str  # the node lost (the first, when one recovery took several)
    cause: str
    at: datetime  # its notice
    training_at: datetime | None  # every rank stepping again
    seconds: float | None = None  # the recovery time, as every renderer shows it
    steps_lost: int | None = None
    resumed_from: int | None = None  # the step the resumed run restored (the figure's)
    took: list[Life] = field(default_factory=list)  # the lives it replaced


def window(doc: dict[str, Any], events: list[JobEvent], now: datetime) -> tuple[JobStatus, datetime, datetime]:
    """(the status of the job document `doc`, its registration, its end): the end is its last event once the job
    is over, else `now`."""
    status = JobStatus.model_validate(doc.get("status") or {})
    started = doc.get("created_at") or (events[0].at if events else now)
    ended = events[-1].at if status.state.terminal and events else now
    return status, started, ended


def lives(events: Iterable[JobEvent], heartbeats: dict[str, Heartbeat]) -> tuple[list[Life], int]:
    """The runs in the order they began, and how many creates (or starts in place) were refused."""
    out: list[Life] = []
    current: dict[int, Life] = {}
    refused = 0
    for ev in events:
        d = ev.details
        slot = int(d.get("slot") or 0)
        node = d.get("node")
        life = current.get(slot)
        lost = d.get("lost")
        if isinstance(lost, dict) and life is not None and life.node == lost.get("node") and life.ended_at is None:
            life.ended_at, life.end_cause = ev.at, ev.cause
            life.said(lost)
        if ev.cause.startswith("zone_refused_") and node:
            if life is not None and life.node == node and life.running_at is None:
                out.remove(life)  # the create (or the start in place) was refused: no run
                del current[slot]
                refused += 1
            continue
        new = d.get("in_place") and life is not None and life.node == node
        if node and (new or d.get("provisioning") and (life is None or life.node != node or life.ended_at)):
            if life is not None and life.ended_at is None:
                life.ended_at, life.end_cause = ev.at, ev.cause
            model = d.get("provisioning") or (life.model if life is not None else "")
            zone = d.get("zone") or (life.zone if life is not None else "")
            current[slot] = Life(slot, node, int(d.get("attempt") or 0), zone, model, ev.at)
            out.append(current[slot])
        elif ev.cause == "node_running" and node and life is not None and life.node == node:
            life.running_at = life.running_at or ev.at
        if ev.to_state.terminal:
            for life in current.values():
                if life.ended_at is None:
                    life.ended_at, life.end_cause = ev.at, ev.to_state.value.lower()
            current.clear()
    # A node's heartbeat is its newest run's, when it began within that run.
    for node, hb in heartbeats.items():
        runs = [life for life in out if life.node == node]
        if runs and (hb.started_at is None or hb.started_at >= runs[-1].created_at):
            runs[-1].said(hb)
    return out, refused


def recoveries(all_lives: list[Life], events: Iterable[JobEvent]) -> list[Recovery]:
    """Each recovery an event tells (its figure: recovery_time; a `recovered` event, or the job's end when its last run
    finished before a reconcile saw it step), naming the losses (lives that ran and were ended by another's create)
    since the previous one; then the losses not recovered yet. An event of an older
    controller, without the figure, counts from the loss to the event."""
    pending = sorted((life for life in all_lives if life.ended_at is not None and life.end_cause not in ENDS
                      and life.running_at is not None), key=lambda life: life.ended_at)  # type: ignore[arg-type,return-value]
    out = []
    for ev in events:
        if not recovery_time.told(ev.cause, ev.details):
            continue
        took = [life for life in pending if life.ended_at <= ev.at]  # type: ignore[operator]
        pending = pending[len(took):]
        first = took[0] if took else None
        fig = recovery_time.read(ev.details)
        if fig is not None:
            out.append(Recovery(first.slot if first else 0, first.node if first else "", fig.cause or "", fig.notice_at,
                                fig.stepping_at, fig.seconds, fig.steps_lost, fig.resumed_from, took))
        elif first is not None:
            assert first.ended_at is not None
            out.append(Recovery(first.slot, first.node, first.end_cause, first.ended_at, ev.at,
                                round((ev.at - first.ended_at).total_seconds(), 1), ev.details.get("steps_lost"),
                                took=took))
    for life in pending:
        assert life.ended_at is not None
        out.append(Recovery(life.slot, life.node, life.end_cause, life.ended_at, None, took=[life]))
    return out


def training_end(life: Life, end: datetime) -> datetime:
    """When this life stopped stepping: its last heartbeat, within the life, and never before its first step (a node
    lost as it joins: its end recorded while its first step's heartbeat was on its way)."""
    assert life.last_beat_at is not None
    stop = min(life.last_beat_at, end)
    return stop if life.first_step_at is None else max(stop, life.first_step_at)


def buckets(started_at: datetime, ended_at: datetime, all_lives: list[Life]) -> dict[str, float]:
    """bucket → seconds; they add up to the wall time (see the module docstring)."""
    out = dict.fromkeys(BUCKETS, 0.0)
    master = sorted((l for l in all_lives if l.slot == 0), key=lambda l: l.created_at)
    t = started_at

    def spend(bucket: str, until: datetime | None) -> None:
        nonlocal t
        if until is None:
            return
        until = min(max(until, t), ended_at)
        out[bucket] += (until - t).total_seconds()
        t = until

    for i, life in enumerate(master):
        end = min(life.ended_at or ended_at, ended_at)
        if i == 0:
            spend("program_startup", life.running_at or end)  # nothing was lost yet: getting the first VM is startup
        else:
            spend("infrastructure_recovery_from_disruption", life.running_at or end)
        if life.trainer_started_at is not None:
            spend("program_startup", min(life.trainer_started_at, end))
        if life.stepped:
            assert life.first_step_at is not None and life.step is not None and life.first_step is not None
            spend("training_prep", min(life.first_step_at, end))
            stop = training_end(life, end)
            steps = life.step - life.first_step
            committed = life.committed_step if life.committed_step is not None else life.first_step
            kept = max(0, min(committed, life.step) - life.first_step)
            spend("productive_training", t + (max(stop, t) - t) * (kept / steps if steps > 0 else 1.0))
            spend("wasted_progress_from_disruption", stop)
        spend("other", end)
    spend("other", ended_at)
    return out
