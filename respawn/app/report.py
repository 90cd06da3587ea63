"""What happened to a job and where its time went, from what Respawn records without user code: the job's lifecycle
events (jobs/{job}/events) and the last heartbeat of each of its nodes (nodes/{node}), read through the job store it
is handed (`write`: `respawn jobs report` and the demo); the rest is pure: the headline, the events in words and the
page (respawn/app/timeline.py, the demo's renderer).

The lives, the recoveries and the goodput buckets (what each holds) are the control plane's pure core's
(respawn.control.goodput), which the controller's Cloud Monitoring series read too; this module renders them.

What the job cost is the controller's own ledger in its status (respawn.control.costs: every node life priced as it
goes; read by respawn.ledger), shown beside it. Every figure a user reads is computed once, by `figures`, and
rendered from there: the page's headline (`headline`: the state, the steps, the preemptions and failures, each
recovery's time and steps lost as the controller measured them (respawn.control.recovery_time), the cost against on
demand and the share saved, and the goodput), its table of losses, `respawn jobs describe` and `jobs report --json`,
and the demo's summary (sim/demo/summary.from_record). Its events are told in words, at their time on the chart's
axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from respawn import ledger, losswords
from respawn.control import goodput, recovery_time
from respawn.control.goodput import Life, Recovery
from respawn.schema import Heartbeat, JobEvent
from respawn.prices import usd

from .timeline import Mark, NodeSpan, Timeline, render_html

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
    failures: int | None = None
    # Each loss event's details by (the node lost, when): its emergency save's outcome and the trainer's last error.
    losses: dict[tuple[str, datetime], dict[str, Any]] = field(default_factory=dict)
    events: list[JobEvent] = field(default_factory=list)  # every event kept, oldest first: the record read

    @property
    def wall_seconds(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def ended(self) -> bool:
        """The job is over (a terminal state): a loss it did not recover from never will be."""
        return self.state.upper() in {e.upper() for e in goodput.ENDS}

    @property
    def goodput_ratio(self) -> float:
        wall = self.wall_seconds
        return self.goodput.get("productive_training", 0.0) / wall if wall > 0 else 0.0


def build(job_id: str, state: str, started_at: datetime, ended_at: datetime, events: list[JobEvent],
          heartbeats: dict[str, Heartbeat]) -> Report:
    all_lives, refused = goodput.lives(events, heartbeats)
    losses = {(d["lost"].get("node"), ev.at): d for ev in events
              for d in [ev.details] if isinstance(d.get("lost"), dict)}
    return Report(job_id, state, started_at, ended_at, all_lives, goodput.recoveries(all_lives, events), refused,
                  goodput.buckets(started_at, ended_at, all_lives), losses=losses, events=events)


def noticed(cause: str) -> bool:
    """The loss came from the platform (a preemption, a planned stop): it had a notice. Any other cause is the job's
    own fault (a crash, a setup that failed, a node that never reported): drawn and told as a failure, never as a
    notice."""
    return cause in (recovery_time.PREEMPTED, recovery_time.RUN_ENDED)


def _loss_detail(r: Report, x: Recovery, key: str) -> Any:
    """What the loss event of `x`'s first life says under `key` (its details, or the `lost` record in them): read
    with .get, so a record written before the field existed reads as None."""
    life = x.took[0] if x.took else None
    d = r.losses.get((life.node, life.ended_at), {}) if life is not None else {}
    lost = d.get("lost") if isinstance(d.get("lost"), dict) else {}
    value = d.get(key)
    return value if value is not None else lost.get(key)


def _replacement(r: Report, x: Recovery) -> Life | None:
    """The life that took over from `x`'s last lost life in its slot (None: none began)."""
    if not x.took:
        return None
    last = x.took[-1]
    since = last.ended_at or last.created_at
    later = [life for life in r.lives if life.slot == last.slot and life.created_at >= since and life is not last]
    return later[0] if later else None


def _stages(r: Report, x: Recovery, details: dict[str, Any]) -> dict[str, float]:
    """Where the recovery's time went: as its `recovered` event carries it, else from the same record's moments (the
    replacement's create, running, trainer start) through the same function (recovery_time.stages)."""
    told = details.get("stages")
    if isinstance(told, dict) and told:
        return {k: float(v) for k, v in told.items()}
    if x.training_at is None:
        return {}
    new = _replacement(r, x)
    ends = [("waiting_for_capacity", new.created_at if new else None),
            ("vm_create_and_boot", new.running_at if new else None),
            ("setup", new.trainer_started_at if new else None)]
    return recovery_time.stages(x.at, ends, x.training_at)


def _told_by(r: Report, x: Recovery) -> dict[str, Any]:
    """The details of the event that told `x`'s recovery (its `recovered` event, or the job's end); {}: none did."""
    for ev in r.events:
        fig = recovery_time.read(ev.details) if recovery_time.told(ev.cause, ev.details) else None
        if fig is not None and x.training_at is not None and fig.stepping_at == x.training_at:
            return ev.details
    return {}


def figures(r: Report) -> dict[str, Any]:
    """Every figure a user reads of the job, computed once from its record: the report page's headline, `respawn jobs
    describe` (its table and --json), `respawn jobs report --json` and the demo's summary render these, never their
    own. Times are seconds since the job's registration (the chart's 0) as well as RFC 3339."""
    losses = []
    for x, usd_each in zip(r.recoveries, preemption_costs(r)):
        details = _told_by(r, x)
        new = _replacement(r, x)
        back = x.training_at is not None
        losses.append({
            "node": x.lost, "cause": x.cause, "noticed": noticed(x.cause),
            "at": x.at.isoformat(), "at_seconds": round((x.at - r.started_at).total_seconds(), 1),
            "zone": x.took[0].zone if x.took else None, "new_zone": new.zone if new and back else None,
            # recovered: every rank stepped again; never: the job ended first; recovering: not yet.
            "outcome": "recovered" if back else "never" if r.ended else "recovering",
            "seconds": x.seconds if back else None,
            "stepping_at_seconds": round((x.training_at - r.started_at).total_seconds(), 1) if back else None,
            "steps_lost": x.steps_lost if back else None, "resumed_from": x.resumed_from if back else None,
            "stages": _stages(r, x, details),
            # The save's outcome as the recovery tells it (its save ended after the loss event was written), else
            # as the loss event does.
            "emergency": details.get("emergency") or _loss_detail(r, x, "emergency"),
            "last_error": details.get("last_error") or _loss_detail(r, x, "last_error"),
            "cost_usd": round(usd_each, 4) if back and usd_each is not None else None,
        })
    recovered = [x for x in losses if x["outcome"] == "recovered"]
    lost = [x["steps_lost"] for x in recovered]
    out: dict[str, Any] = {
        "job": r.job_id, "state": r.state,
        "steps": {"done": r.step, "committed": r.committed_step, "total": r.total_steps},
        "preemptions": r.preemptions, "failures": r.failures,
        "wall_seconds": round(r.wall_seconds, 1),
        "goodput": round(r.goodput_ratio, 4),
        "buckets_seconds": {k: round(v, 1) for k, v in r.goodput.items()},
        "lives": len(r.lives), "refused_creates": r.refused,
        "recoveries": losses,
        "recovery_seconds": [x["seconds"] for x in recovered],
        "steps_lost": None if None in lost else sum(lost),  # type: ignore[arg-type]
        "last_error": next((x["last_error"] for x in reversed(losses) if x["last_error"]), None),
    }
    if r.cost is not None:
        paid, on_demand = r.cost["so_far_usd"], r.cost["on_demand_usd"]
        kept = r.goodput.get("productive_training", 0.0) > 0
        # Saved against on demand: 1 − what the job paid ÷ the same node time on demand (the one meaning, `respawn
        # plan`'s too); a job that kept no step saved nothing, whatever its nodes cost.
        out["cost"] = {**r.cost, "saved": round(1 - paid / on_demand, 4) if kept and on_demand > 0 else None,
                       **({} if kept else {"saved_why": "no step was kept"})}
    return out


def describe(r: Report) -> dict[str, Any]:
    """The report's figures as plain values (figures): `respawn jobs describe --json`, `jobs report --json`."""
    return figures(r)


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


def _share(x: float) -> str:
    return f"{x:.0%}"


def saved_text(cost: dict[str, Any]) -> str:
    """The share saved against on demand as every page says it: '42%', or 'none (no step was kept)'."""
    return _share(cost["saved"]) if cost.get("saved") is not None else f"none ({cost.get('saved_why') or 'no cost'})"


def outcome_text(x: dict[str, Any]) -> str:
    """A loss's recovery in words: '9.8 s', 'never stepped again' (the job ended first), 'recovering'."""
    if x["outcome"] == "recovered":
        return recovery_time.text(x["seconds"])
    return "never stepped again" if x["outcome"] == "never" else "recovering"


def emergency_text(e: Any) -> str | None:
    """The noticed node's emergency save in words (respawn.losswords: Slack's wording); None: none recorded."""
    return losswords.emergency_sentence(e if isinstance(e, dict) else None)


def headline(f: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, label, value) of the figures a user asks first (figures): the page's headline, in this order."""
    out = [("state", "state", f["state"].lower())]
    steps = f["steps"]
    if steps["done"] is not None or steps["total"]:
        done = "-" if steps["done"] is None else str(steps["done"])
        committed = f" (committed {steps['committed']})" if steps["committed"] not in (None, steps["done"]) else ""
        out.append(("steps", "steps", f"{done} of {steps['total']}{committed}" if steps["total"] else done + committed))
    if f["preemptions"] is not None:
        out.append(("preemptions", "preemptions", str(f["preemptions"])))
    crashes = [x for x in f["recoveries"] if not x["noticed"]]
    if f["failures"] or crashes:
        out.append(("failures", "failures (the job's own: crashes, setup, no heartbeat)",
                    str(f["failures"] if f["failures"] is not None else len(crashes))))
    if f["last_error"]:
        out.append(("last_error", "the trainer's last error", f["last_error"]))
    back = [outcome_text(x) for x in f["recoveries"] if x["outcome"] == "recovered"]
    never = sum(x["outcome"] == "never" for x in f["recoveries"])
    # Losses that never recovered counted once, not listed (a failed job's four crashes are one fact).
    rest = [f"{never} {'loss' if never == 1 else 'losses'} never stepped again"] if never else []
    rest += ["recovering"] * sum(x["outcome"] == "recovering" for x in f["recoveries"])
    out.append(("recoveries", "recovery time, each (loss → every rank stepping again)",
                ", ".join(back + rest) or "none"))
    out.append(("steps_lost", "steps lost", "unknown" if f["steps_lost"] is None else str(f["steps_lost"])))
    if "cost" in f:
        c = f["cost"]
        out.append(("cost", "cost", f"{usd(c['so_far_usd'])} (on demand {usd(c['on_demand_usd'])})"))
        if c["on_demand_usd"] > 0:
            out.append(("saved", "saved against on demand (1 − cost ÷ the same node time on demand)", saved_text(c)))
        each = [x["cost_usd"] for x in f["recoveries"] if x["outcome"] == "recovered"]
        if each:
            out.append(("cost_per_recovery", "cost of each recovery (its recovery time at the job's rate)",
                        ", ".join("unknown" if c is None else usd(c) for c in each)))
    out.append(("goodput", "goodput: time training, for steps kept (the rest: below)", f"{f['goodput']:.1%}"))
    return out


def goodput_rows(r: Report) -> list[list[str]]:
    """The goodput table: each bucket in words, its seconds and share of the wall time, what it holds."""
    return goodput_rows_of(figures(r))


def goodput_rows_of(f: dict[str, Any]) -> list[list[str]]:
    """goodput_rows from the figures (`respawn jobs describe`'s table is the page's)."""
    wall = f["wall_seconds"] or 1.0
    return [[BUCKET_WORDS[k][0], f"{v:.1f} s", f"{v / wall:.0%}", BUCKET_WORDS[k][1]]
            for k, v in f["buckets_seconds"].items()]


def timeline(r: Report, zones: list[str], f: dict[str, Any]) -> Timeline:
    """The page: the headline, a bar per life, its step line, the losses and recoveries, the figures behind them
    (`f`: figures, so the chart and the headline say one thing)."""
    t0 = r.started_at

    def s(at: datetime) -> float:
        return (at - t0).total_seconds()

    # The step a lost life's replacement restored: its last save, the notice's emergency save when it kept every step
    # the life reached (committed after its last heartbeat, maybe: the figure's, not the heartbeat's).
    restored = {id(life): x.resumed_from for x in r.recoveries if x.resumed_from is not None for life in x.took}
    # An emergency save recorded as not committed is drawn as no save, whatever the steps say.
    failed_save = {id(life) for x, told in zip(r.recoveries, f["recoveries"]) for life in x.took
                   if isinstance(told["emergency"], dict) and told["emergency"].get("state") not in (None, "committed")}
    spans, marks, progress = [], [], []
    for life in r.lives:
        start = life.running_at or life.created_at
        end = life.ended_at or r.ended_at
        spans.append(NodeSpan(life.node, life.zone, s(start), s(end), (life.end_cause or "running").replace("_", " "),
                              model=life.model, slot=life.slot))
        if life.stepped:
            assert life.first_step_at is not None
            stop = s(goodput.training_end(life, end))
            progress.append([(s(life.first_step_at), life.first_step or 0), (stop, life.step or 0)])
            saved = restored.get(id(life), life.committed_step)
            lost = life.ended_at is not None and life.end_cause not in goodput.ENDS
            if (saved is not None and lost and noticed(life.end_cause) and saved >= (life.step or 0)
                    and id(life) not in failed_save):
                marks.append(Mark(s(end), "emergency", f"{life.node} committed step {saved}", life.zone, step=saved))
            elif saved is not None:
                marks.append(Mark(stop, "checkpoint", f"{life.node} committed step {saved}", life.zone))
    recovered = []
    for x, told in zip(r.recoveries, f["recoveries"]):
        what = x.cause.replace("_", " ")
        error = f": {told['last_error']}" if told["last_error"] else ""
        # A crash is drawn as a crash (no notice came); only a platform's loss has a notice.
        marks.append(Mark(s(x.at), "notice" if told["noticed"] else "crash", f"{what} {x.lost}{error}"))
        if x.training_at is not None:
            marks.append(Mark(s(x.training_at), "training again",
                              f"{recovery_time.text(x.seconds)} after the {'notice' if told['noticed'] else 'failure'}"
                              " (recovery time)"))
            recovered.append((s(x.at), s(x.training_at), recovery_time.text(x.seconds)))
    summary = {"job": r.job_id, "state": r.state, "wall": f"{r.wall_seconds:.1f} s", "lives": len(r.lives),
               "refused creates": r.refused}
    if "cost" in f:
        c = f["cost"]
        summary.update({"cost": f"{usd(c['so_far_usd'])} (on demand {usd(c['on_demand_usd'])})",
                        "prices": c["prices"]})
        if "budget_usd" in c:
            summary["budget"] = f"{usd(c['budget_usd'])}, {c['budget_used']} used"
    return Timeline(title=f"respawn: job {r.job_id}", wall_seconds=r.wall_seconds, zones=zones, nodes=spans,
                    marks=marks, downtime=downtime(progress, r.wall_seconds), progress=progress,
                    total_steps=r.total_steps or 0, summary=summary, headline=headline(f), recoveries=recovered)


def downtime(progress: list[list[tuple[float, int]]], wall: float) -> list[tuple[float, float]]:
    """When no trainer was stepping (seconds on the chart's axis): before the first step, and between one life's last
    reported step and the next one's first (the demo's timeline drew the same bands)."""
    spans = sorted((points[0][0], points[-1][0]) for points in progress if points)
    out, reach = [], 0.0
    for start, end in spans:
        if start > reach:
            out.append((reach, start))
        reach = max(reach, end)
    return out if spans else []


def parts_text(x: dict[str, Any]) -> str:
    """Where a recovery's time went, every part named, so they add up to it: '2.0 s waiting for capacity, …'."""
    return ", ".join(f"{recovery_time.text(v)} {recovery_time.STAGES.get(k, k)}" for k, v in x["stages"].items()
                     if v > 0)


def recovery_rows(f: dict[str, Any], parts: bool = True) -> list[list[str]]:
    """One row per loss, as `respawn jobs describe` shows them too: when, what, where, its recovery time (and where
    it went, with `parts`), the steps lost, the emergency save, the error."""
    rows = []
    for x in f["recoveries"]:
        where = x["zone"] or "-"
        if x["new_zone"] and x["new_zone"] != x["zone"]:
            where += f" → {x['new_zone']}"
        went = parts_text(x) if parts else ""
        rows.append([f"{x['at_seconds']:.1f} s", f"{x['cause'].replace('_', ' ')} {x['node']}", where,
                     outcome_text(x) + (f" ({went})" if went else ""),
                     "-" if x["steps_lost"] is None else str(x["steps_lost"]),
                     emergency_text(x["emergency"]) or "-", x["last_error"] or "-"])
    return rows


RECOVERY_HEADER = ["time", "loss", "zone", "recovery time (where it went)", "steps lost", "emergency save",
                   "last error"]


def told_columns(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The emergency save and last error columns only where some row has one (a column of dashes says nothing)."""
    keep = [i for i, h in enumerate(header)
            if h not in ("emergency save", "last error") or any(row[i] != "-" for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


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
        saved = emergency_text(d.get("emergency"))
        return f"{node}:{ended} {recovery_time.line(d)}{resumed}" + (f"; {saved}" if saved else "")
    if isinstance(lost, dict):  # its last heartbeat's steps: an emergency save may commit more (the recovery's)
        committed = f", committed {lost.get('committed_step')}" if lost.get("committed_step") is not None else ""
        at = f" (last heard at step {lost.get('step')}{committed})" if lost.get("step") is not None else ""
        signal = f", told by {d['signal']}" if d.get("signal") else ""
        then = f"; restarting it in place" if d.get("in_place") else ""
        said = losswords.event_words(d)  # a save that did not commit, the last error: as jobs events says them
        return f"{lost.get('node') or node} {ev.cause.replace('_', ' ')}{where}{at}{signal}{then}" + (
            f": {said}" if said else "")
    if d.get("told_late"):  # a save's outcome heard after its loss was recorded (decide.SAVE_OUTCOME)
        return f"{node}: {losswords.event_words(d)}"
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
    r.total_steps, r.preemptions, r.failures = status.total_steps, status.preemptions, status.failures
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
    """One self-contained HTML page: the headline, the timeline, each loss and its recovery, the goodput buckets and
    every event, in words, at its time on the chart's axis (seconds since the job's registration). Every figure is
    figures'."""
    f = figures(r)
    rows = [[f"{(ev.at - r.started_at).total_seconds():.1f} s",
             f"{ev.from_state.value} → {ev.to_state.value}" if ev.from_state else ev.to_state.value,
             event_words(ev)] for ev in events]
    losses = [("recoveries", *told_columns(RECOVERY_HEADER, recovery_rows(f)))] if f["recoveries"] else []
    return render_html(timeline(r, zones, f), tables=[
        *losses, ("goodput", ["where the time went", "time", "share", "what it holds"], goodput_rows_of(f)),
        ("events", ["time", "state", "what happened"], rows)])
