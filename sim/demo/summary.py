"""What a demo run measured, computed from what the runner recorded: heartbeats over time, node lifetimes from the
sim, the job's final status and the Slack payloads. Pure functions, tested without any process.

The figures a user compares across pages (goodput and its buckets, steps lost, each recovery's time and its notice,
cost and the share saved) are not measured here: they are the job's record's, as respawn.app.report.figures computes
them once for the report page, `respawn jobs describe` and this summary alike (`from_record`). What stays here is the
demo's own checks: how many nodes served at once, the zones and models in order, each trainer life's step line.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HeartbeatSample:
    t: float  # seconds since the job was registered
    node: str
    life: str  # tells two agent lives on one node apart (restart in place): the agent's started_at
    state: str
    step: int | None
    committed_step: int | None
    resumed_from: int | None = None
    worker: int = 0  # the host of a multi-host TPU slice whose heartbeat this is; `node` is the slice's name
    generation: int | None = None  # a member of a job of several nodes: the generation its trainer runs


@dataclass
class Lifetime:
    """One instance or TPU node: alive (billing an accelerator) from `start` to `end` (None: still alive)."""

    name: str
    zone: str
    start: float
    end: float | None
    end_reason: str = ""
    slot: str | None = None  # a multi-node job's member slot (the node's respawn-slot label)
    model: str = ""  # its provisioning model as a job spec names it: spot, flex-start, standard


@dataclass
class Life:
    node: str
    life: str
    first_t: float
    last_t: float
    first_step: int
    last_step: int
    resumed_from: int | None
    last_committed: int | None


@dataclass
class RunRecord:
    job_id: str
    total_steps: int | None  # the job's, as its trainer reported it; None when it never did
    wall_seconds: float
    state: str
    restarts: int
    samples: list[HeartbeatSample] = field(default_factory=list)
    lifetimes: list[Lifetime] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    noticed: dict[str, float] = field(default_factory=dict)  # node → when its loss was injected
    # Each recovery as the controller measured and recorded it: the details of the job's `recovered` events
    # (respawn.control.recovery_time), the same figure as Slack's, the events' and the report's.
    recovered: list[dict] = field(default_factory=list)


def lives(samples: list[HeartbeatSample]) -> list[Life]:
    """Trainer lives in order, from the heartbeats that reported a step. A multi-host slice's life is worker 0's:
    its processes stop at one agreed step, and each worker's agent has a life of its own, which counted apart would
    read as one life lost to the next. A job of several nodes lives one generation at a time: every member's
    heartbeat of a generation counts toward that generation's life (a survivor's agent lives on across them)."""
    by_key: dict[tuple[str, str], Life] = {}
    for s in sorted(samples, key=lambda s: s.t):
        if s.step is None or s.worker != 0:
            continue
        key = ("generation", str(s.generation)) if s.generation is not None else (s.node, s.life)
        life = by_key.get(key)
        if life is None:
            by_key[key] = Life(s.node, s.life, s.t, s.t, s.step, s.step, s.resumed_from, s.committed_step)
            continue
        if s.step > life.last_step:  # a finished node's document keeps its last step: only progress counts
            life.last_t, life.last_step = s.t, s.step
        life.first_step = min(life.first_step, s.step)
        if s.committed_step is not None:
            life.last_committed = s.committed_step
        if life.resumed_from is None and s.resumed_from is not None:
            life.resumed_from = s.resumed_from
    return sorted(by_key.values(), key=lambda life: life.first_t)


def recoveries(recovered: list[dict]) -> list[dict]:
    """Each recovery as the job's `recovered` event says (recovery_time.Recovery.fields): its cause, its time from
    the notice until every rank steps again, and the steps it lost. One that never completed has no event."""
    keys = ("loss_cause", "recovery_seconds", "steps_lost", "furthest_step", "resumed_from", "notice_at",
            "stepping_at")
    return [{k: d.get(k) for k in keys} for d in recovered]


def workers_seen(samples: list[HeartbeatSample]) -> dict[str, list[int]]:
    """Per node, the workers that beat (a single host: [0])."""
    seen: dict[str, set[int]] = {}
    for s in samples:
        seen.setdefault(s.node, set()).add(s.worker)
    return {node: sorted(ws) for node, ws in seen.items()}


def lost_steps(ordered: list[Life]) -> int:
    """Steps trained twice: how far each life got beyond the step the next one resumed from."""
    lost = 0
    for prev, nxt in zip(ordered, ordered[1:]):
        resumed = nxt.resumed_from
        if resumed is None:  # an agent that did not report it: the next life started from the newest commit
            resumed = prev.last_committed if prev.last_committed is not None else 0
        lost += max(0, prev.last_step - resumed)
    return lost


def serving(lifetimes: list[Lifetime], noticed: dict[str, float]) -> list[Lifetime]:
    """The lifetimes up to each node's notice: from there a node only saves its emergency checkpoint and goes, while
    its replacement may already boot beside it (the controller acts on the notice); the one-node-per-slot rule
    counts the nodes serving."""
    out = []
    for lt in lifetimes:
        t = noticed.get(lt.name)
        if t is not None and lt.start <= t and (lt.end is None or t < lt.end):
            lt = Lifetime(lt.name, lt.zone, lt.start, t, lt.end_reason, lt.slot, lt.model)
        out.append(lt)
    return out


def max_live(lifetimes: list[Lifetime], until: float) -> int:
    points = []
    for lt in lifetimes:
        points.append((lt.start, 1))
        points.append((lt.end if lt.end is not None else until, -1))
    # At equal times an end comes before a start: a replacement created as its predecessor dies is not overlap.
    live = peak = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        live += delta
        peak = max(peak, live)
    return peak


def zones_in_order(lifetimes: list[Lifetime]) -> list[str]:
    """Zones as the job moved through them; a node live twice (restarted in place, or deleting) counts once."""
    zones: list[str] = []
    for lt in sorted(lifetimes, key=lambda lt: lt.start):
        if not zones or zones[-1] != lt.zone:
            zones.append(lt.zone)
    return zones


def models_in_order(lifetimes: list[Lifetime]) -> list[str]:
    """The provisioning model of each node that ran, in the order they started (a node live twice counts once)."""
    seen: dict[str, str] = {}
    for lt in sorted(lifetimes, key=lambda lt: lt.start):
        seen.setdefault(lt.name, lt.model)
    return list(seen.values())


def goodput(ordered: list[Life], final_step: int, wall_seconds: float) -> float:
    """Share of wall time spent on steps that were not redone, at the run's measured seconds per step."""
    trained_steps = sum(life.last_step - life.first_step for life in ordered)
    trained_time = sum(life.last_t - life.first_t for life in ordered)
    if trained_steps <= 0 or wall_seconds <= 0:
        return 0.0
    return min(1.0, final_step * (trained_time / trained_steps) / wall_seconds)


def recorded_steps_lost(recovered: list[dict]) -> int | None:
    """The steps the job's recoveries lost, as their events recorded them (None: one did not say)."""
    lost = [d.get("steps_lost") for d in recovered]
    return None if None in lost else sum(lost)  # type: ignore[arg-type]


def from_record(result: dict, figures: dict) -> dict:
    """The summary with the record's figures in place of any measured here (respawn.app.report.figures: the report
    page's and `respawn jobs describe`'s): goodput and its buckets, steps lost, each recovery's time and notice (seconds
    since the job's registration), the share saved against on demand, said after the `cost` row's words."""
    from respawn.app.report import saved_text

    cost = figures.get("cost")
    result.update(goodput=figures["goodput"], goodput_buckets=figures["buckets_seconds"],
                  lost_steps=figures["steps_lost"], recovery_seconds=figures["recovery_seconds"],
                  notice_seconds=[x["at_seconds"] for x in figures["recoveries"] if x["noticed"]],
                  saved_vs_on_demand=cost.get("saved") if cost else None)
    if cost and isinstance(result.get("cost"), str) and cost["on_demand_usd"] > 0:
        result["cost"] += f"; saved against on demand: {saved_text(cost)}"
    if figures.get("last_error"):
        result["last_error"] = figures["last_error"]
    return result


def summarize(rec: RunRecord) -> dict:
    ordered = lives(rec.samples)
    up = serving(rec.lifetimes, rec.noticed)
    final_step = ordered[-1].last_step if ordered else 0
    return {
        "job_id": rec.job_id,
        "state": rec.state,
        "final_step": final_step,
        "total_steps": rec.total_steps,
        "restarts": rec.restarts,
        "zones": zones_in_order(rec.lifetimes),
        "provisioning": models_in_order(rec.lifetimes),
        # The record's figure (each `recovered` event's), not the samples' (which counted steps redone by a life
        # that never resumed as lost): from_record replaces it with the report's, the same sum.
        "lost_steps": recorded_steps_lost(rec.recovered),
        "max_live_nodes": max_live(up, rec.wall_seconds),
        # The most nodes one member slot had serving at once (a slot holds at most one node, besides one saving in its
        # notice; 0 for a one-node job).
        "max_live_per_slot": max((max_live([lt for lt in up if lt.slot == slot], rec.wall_seconds)
                                  for slot in {lt.slot for lt in up if lt.slot is not None}), default=0),
        "alerts": rec.alerts,
        "wall_seconds": round(rec.wall_seconds, 2),
        "goodput": round(goodput(ordered, final_step, rec.wall_seconds), 4),
        "workers": workers_seen(rec.samples),
        "recovery_seconds": [r["recovery_seconds"] for r in recoveries(rec.recovered)],
        "recoveries": recoveries(rec.recovered),
    }
