"""What happened to a job and where its time went, from what Respawn records without user code: the job's lifecycle
events (jobs/{job}/events) and the last heartbeat of each of its nodes (nodes/{node}), read through the job store it
is handed (`write`: `respawn jobs report` and the demo); the rest is pure: the headline, the events in words and the
page (respawn/app/timeline.py, the demo's renderer).

The lives, the recoveries and the goodput buckets (what each holds) are the control plane's pure core's
(respawn.control.goodput), which the controller's Cloud Monitoring series read too; this module renders them.

What the job cost is the controller's own ledger in its status (respawn.control.costs: every node life priced as it
goes; read by respawn.ledger), shown beside it. The page opens with a headline (`headline`): the state, the steps, the preemptions, each
recovery's time and steps lost (the controller's figure: respawn.control.recovery_time), the cost against on demand
and what each preemption cost, and the goodput; its events are told in words, at their time on the chart's axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from respawn import ledger
from respawn.control import goodput, recovery_time
from respawn.control.goodput import Life, Recovery
from respawn.schema import Heartbeat, JobEvent
from respawn.prices import usd
from respawn.app.timeline import Mark, NodeSpan, Timeline, render_html

# The buckets in a user's words: (label, what it holds). The keys stay ml-goodput-measurement's (describe, metrics).
BUCKET_WORDS = {
    "productive_training": ("training", "stepping, for the steps that were kept"),
    "wasted_progress_from_disruption": ("redone after a loss", "steps past the last checkpoint, done again"),
    "infrastructure_recovery_from_disruption": ("waiting for a new VM", "after a loss: capacity, create, boot"),
    "program_startup": ("starting up", "the first VM, then each VM's agent, workdir and setup"),
    "training_prep": ("trainer start and restore", "interpreter, framework, restore, first step"),
    "other": ("unaccounted", "no heartbeat said what the node did"),
}


@dataclass
class Report:
    job_id: str
    state: str
    started_at: datetime
    ended_at: datetime
    lives: list[Life] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    refused: int = 0  # creates refused (capacity, quota): no node
    goodput: dict[str, float] = field(default_factory=dict)  # bucket → seconds
    cost: dict[str, Any] | None = None  # the controller's ledger (respawn.ledger.summary), when read
    # From the job's status, when read (load): the newest step, committed step, the total, the preemptions.
    step: int | None = None
    committed_step: int | None = None
    total_steps: int | None = None
    preemptions: int | None = None

    @property
    def wall_seconds(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def goodput_ratio(self) -> float:
        wall = self.wall_seconds
        return self.goodput.get("productive_training", 0.0) / wall if wall > 0 else 0.0


def build(job_id: str, state: str, started_at: datetime, ended_at: datetime, events: list[JobEvent],
          heartbeats: dict[str, Heartbeat]) -> Report:
    all_lives, refused = goodput.lives(events, heartbeats)
    return Report(job_id, state, started_at, ended_at, all_lives, goodput.recoveries(all_lives, events), refused,
                  goodput.buckets(started_at, ended_at, all_lives))


def describe(r: Report) -> dict[str, Any]:
    """The report's figures as plain values: `respawn jobs describe`, `--json`, the page's summary."""
    wall = r.wall_seconds
    return {
        "wall_seconds": round(wall, 1),
        "goodput": round(r.goodput_ratio, 4),
        "buckets_seconds": {k: round(v, 1) for k, v in r.goodput.items()},
        "lives": len(r.lives),
        "refused_creates": r.refused,
        "recoveries": [{"node": x.lost, "cause": x.cause, "at": x.at.isoformat(), "seconds": x.seconds,
                        "steps_lost": x.steps_lost} for x in r.recoveries],
        **({"cost": r.cost} if r.cost is not None else {}),
    }


def _running_seconds(r: Report) -> float:
    """The seconds during which any node of the job ran (the union of its lives from running to their end)."""
    spans = sorted((life.running_at, min(life.ended_at or r.ended_at, r.ended_at)) for life in r.lives
                   if life.running_at is not None)
    total, reach = 0.0, None
    for start, end in spans:
        start = max(start, reach) if reach is not None else start
        if end > start:
            total += (end - start).total_seconds()
        reach = max(end, reach) if reach is not None else end
    return total


def preemption_costs(r: Report) -> list[float | None]:
    """What each recovery cost in dollars: its recovery time at what the job paid a second while its nodes ran (the
    ledger's cost over that time); None where the recovery has no time yet or nothing was priced."""
    ran = _running_seconds(r)
    rate = r.cost["so_far_usd"] / ran if r.cost is not None and ran > 0 else None
    return [None if rate is None or x.seconds is None else x.seconds * rate for x in r.recoveries]


def headline(r: Report) -> list[tuple[str, str, str]]:
    """(key, label, value) of the figures a user asks first: the page's headline, in this order."""
    out = [("state", "state", r.state.lower())]
    if r.step is not None or r.total_steps:
        done = "-" if r.step is None else str(r.step)
        committed = f" (committed {r.committed_step})" if r.committed_step not in (None, r.step) else ""
        out.append(("steps", "steps", f"{done} of {r.total_steps}{committed}" if r.total_steps else done + committed))
    if r.preemptions is not None:
        out.append(("preemptions", "preemptions", str(r.preemptions)))
    out.append(("recoveries", "recovery time, each (notice → every rank stepping)",
                ", ".join(recovery_time.text(x.seconds) if x.training_at is not None else "still recovering"
                          for x in r.recoveries) or "none"))
    lost = [x.steps_lost for x in r.recoveries if x.training_at is not None]
    out.append(("steps_lost", "steps lost", "unknown" if None in lost else str(sum(lost))))  # type: ignore[arg-type]
    if r.cost is not None:
        paid, on_demand = r.cost["so_far_usd"], r.cost["on_demand_usd"]
        out.append(("cost", "cost", f"{usd(paid)} (on demand {usd(on_demand)})"))
        if on_demand > 0:
            out.append(("saved", "saved against on demand", f"{1 - paid / on_demand:.0%}"))
        each = preemption_costs(r)
        if each:
            out.append(("cost_per_preemption", "cost of each preemption (its recovery time at the job's rate)",
                        ", ".join("unknown" if c is None else usd(c) for c in each)))
    out.append(("goodput", "goodput: time training, for steps kept (the rest: below)", f"{r.goodput_ratio:.1%}"))
    return out


def goodput_rows(r: Report) -> list[list[str]]:
    """The goodput table: each bucket in words, its seconds and share of the wall time, what it holds."""
    wall = r.wall_seconds or 1.0
    return [[BUCKET_WORDS[k][0], f"{v:.1f} s", f"{v / wall:.0%}", BUCKET_WORDS[k][1]] for k, v in r.goodput.items()]


def timeline(r: Report, zones: list[str]) -> Timeline:
    """The page: the headline, a bar per life, its step line, the losses and recoveries, the figures behind them."""
    t0 = r.started_at

    def s(at: datetime) -> float:
        return (at - t0).total_seconds()

    # The step a lost life's replacement restored: its last save, the notice's emergency save when it kept every step
    # the life reached (committed after its last heartbeat, maybe: the figure's, not the heartbeat's).
    restored = {id(life): x.resumed_from for x in r.recoveries if x.resumed_from is not None for life in x.took}
    spans, marks, progress = [], [], []
    for life in r.lives:
        start = life.running_at or life.created_at
        end = life.ended_at or r.ended_at
        spans.append(NodeSpan(life.node, life.zone, s(start), s(end), life.end_cause or "running", model=life.model,
                              slot=life.slot))
        if life.stepped:
            assert life.first_step_at is not None
            stop = s(goodput.training_end(life, end))
            progress.append([(s(life.first_step_at), life.first_step or 0), (stop, life.step or 0)])
            saved = restored.get(id(life), life.committed_step)
            lost = life.ended_at is not None and life.end_cause not in goodput.ENDS
            if saved is not None and lost and saved >= (life.step or 0):
                marks.append(Mark(s(end), "emergency", f"{life.node} committed step {saved}", life.zone, step=saved))
            elif saved is not None:
                marks.append(Mark(stop, "checkpoint", f"{life.node} committed step {saved}", life.zone))
    recovered = []
    for x in r.recoveries:
        marks.append(Mark(s(x.at), "notice", f"{x.cause} {x.lost}"))
        if x.training_at is not None:
            marks.append(Mark(s(x.training_at), "training again",
                              f"{recovery_time.text(x.seconds)} after the notice (recovery time)"))
            recovered.append((s(x.at), s(x.training_at), recovery_time.text(x.seconds)))
    summary = {"job": r.job_id, "state": r.state, "wall": f"{r.wall_seconds:.1f} s", "lives": len(r.lives),
               "refused creates": r.refused}
    if r.cost is not None:
        summary.update({"cost": f"{usd(r.cost['so_far_usd'])} (on demand {usd(r.cost['on_demand_usd'])})",
                        "prices": r.cost["prices"]})
        if "budget_usd" in r.cost:
            summary["budget"] = f"{usd(r.cost['budget_usd'])}, {r.cost['budget_used']} used"
    return Timeline(title=f"respawn: job {r.job_id}", wall_seconds=r.wall_seconds, zones=zones, nodes=spans,
                    marks=marks, progress=progress, total_steps=r.total_steps or 0, summary=summary,
                    headline=headline(r), recoveries=recovered)


def event_words(ev: JobEvent) -> str:
    """What an event says, in words: 'demo-1 preempted in us-central1-a (last heard at step 93, committed 90)'."""
    d = ev.details
    node, zone = d.get("node") or "", d.get("zone") or ""
    where = f" in {zone}" if zone else ""
    lost = d.get("lost")
    if recovery_time.told(ev.cause, d):  # `recovered`, or the job's end that tells the recovery of its last run
        fig = recovery_time.read(d)
        resumed = f"; resumed from step {fig.resumed_from}" if fig is not None and fig.resumed_from is not None else ""
        ended = "" if ev.cause == "recovered" else f" {ev.cause.replace('_', ' ')}{where};"
        return f"{node}:{ended} {recovery_time.line(d)}{resumed}"
    if isinstance(lost, dict):  # its last heartbeat's steps: an emergency save may commit more (the recovery's)
        committed = f", committed {lost.get('committed_step')}" if lost.get("committed_step") is not None else ""
        at = f" (last heard at step {lost.get('step')}{committed})" if lost.get("step") is not None else ""
        signal = f", told by {d['signal']}" if d.get("signal") else ""
        then = f"; restarting it in place" if d.get("in_place") else ""
        return f"{lost.get('node') or node} {ev.cause.replace('_', ' ')}{where}{at}{signal}{then}"
    if ev.cause.startswith("zone_refused_"):
        why = ev.cause.removeprefix("zone_refused_").replace("_", " ")
        code = f" ({d['code']})" if d.get("code") else ""
        return f"{zone or 'the zone'} refused {node or 'the node'}: no {why}{code}"
    if d.get("provisioning") and node:
        how = "restarted in place" if d.get("in_place") else f"asked for ({d['provisioning']}, attempt {d.get('attempt')})"
        return f"{node}{where} {how}"
    if ev.cause == "node_running" and node:
        return f"{node} running{where}"
    if ev.cause == "registered":
        return "registered" + (f" from {d['source']}" if d.get("source") else "")
    rest = ", ".join(f"{k} {v}" for k, v in d.items() if k not in ("node", "zone", "attempt")
                     and isinstance(v, (str, int, float)))
    return " ".join(x for x in (node, ev.cause.replace("_", " ") + where, f"({rest})" if rest else "") if x)


def of_record(job_id: str, doc: dict[str, Any], events: list[JobEvent], heartbeats: dict[str, Heartbeat],
              now: datetime) -> Report:
    """The report of the job document `doc` (its spec, status, created_at), its events and its nodes' heartbeats."""
    status, started, ended = goodput.window(doc, events, now)
    r = build(job_id, status.state.value, started, ended, events, heartbeats)
    budget = ((doc.get("spec") or {}).get("budget") or {}).get("max_usd")
    r.cost = ledger.summary(status, ended, budget)
    r.step, r.committed_step = status.last_step, status.last_committed_step
    r.total_steps, r.preemptions = status.total_steps, status.preemptions
    return r


def load(store: Any, job_id: str, database: str | None = None) -> tuple[Report, dict[str, Any], list[JobEvent]]:
    """(the report, the job document, its events) read through a respawn.app.jobstore.JobStore: the document, every
    event, the nodes' heartbeats from `database` (by default where they beat). Raises NoSuchJob."""
    doc = store.job_document(job_id)
    events = store.all_events(job_id)
    beats = store.heartbeats(job_id, database or store.heartbeat_database(job_id))
    return of_record(job_id, doc, events, beats, datetime.now(timezone.utc)), doc, events


def write(store: Any, job_id: str, path: Path, database: str | None = None) -> tuple[Path, Report]:
    """Read the job (load) and write its page to `path`."""
    r, doc, events = load(store, job_id, database)
    zones = list((doc.get("spec") or {}).get("zones") or sorted({life.zone for life in r.lives}))
    path.write_text(render(r, zones, events))
    return path, r


def render(r: Report, zones: list[str], events: list[JobEvent]) -> str:
    """One self-contained HTML page: the headline, the timeline, the goodput buckets and every event, in words, at
    its time on the chart's axis (seconds since the job's registration)."""
    rows = [[f"{(ev.at - r.started_at).total_seconds():.1f} s",
             f"{ev.from_state.value} → {ev.to_state.value}" if ev.from_state else ev.to_state.value,
             event_words(ev)] for ev in events]
    return render_html(timeline(r, zones), tables=[
        ("goodput", ["where the time went", "time", "share", "what it holds"], goodput_rows(r)),
        ("events", ["time", "state", "what happened"], rows)])
