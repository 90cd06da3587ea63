"""A job, whatever its number of nodes: each member slot decided by decide.decide, the membership over them. The
one entry of the decision core (reconcile calls decide, after_act and event here, for every job). Pure: no cloud
library, no I/O, no clock.

The job document's status (respawn.schema.JobStatus) holds the job (its zone, its state summed up, the job-wide
counters: JobCounters) and `members`: one MemberStatus per slot, the life of its current node. A one-node job is
one slot. A slot is decided by decide.decide with the user's spec, the slot itself (membership.slot_of: the zones
it may use, the job's zone once the job has one; its tiers, standard alone for the first on_demand_nodes slots) and
a SlotStatus (project): the slot's own node, the job's counters; merge puts each part of the decided SlotStatus
back where its type says. So a lost member is deleted and replaced, restarted in place, refused, fallen back to
on-demand, exactly as every other node; its replacement takes the job-wide attempt counter's next number (a new
deterministic name). Slot 0 places the job: while no other slot holds a node it walks the whole zone list; every
other slot waits for it and then stays in its zone. The job's progress is written here alone (progress), from its
members' heartbeats, whatever the decision.

A job of one node and no spares forms no generation (membership.forms_generations): its slot's decision is the
job's, and the top level of its status repeats its slot. For several slots, when no slot has anything to do,
membership.plan reads the slots: it forms the generation of `nodes` serving members (committed, then written into
each member's metadata at once: the job's own action, SetGeneration; a member that left it during its notice is
named in it, so a spare taking its place restores only after that member's emergency save), keeps the survivors' generation while a replacement is on its
way, continues on fewer nodes when the zone refused and min_nodes allows, or moves the whole job: `moving` is
committed, every member is deleted, and slot 0 places the job again outside the zones tried. Such a job ends
SUCCEEDED when a member's trainer exited 0 with the last step committed (or every member of its generation exited
0).

A member's loss that leaves enough slots serving for a new generation (a warm spare in its place) is committed with
that generation, written to its members at once, in the pass that sees it (_spare_first); the slot's own action (the
replacement's create, the lost node's delete) follows in the next pass, derived again from what was committed. So
the spare steps again within the lost member's notice instead of waiting for its own replacement's create.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Sequence

from respawn import losswords, prices
from respawn.contract import EXITS_ON_NOTICE, SOFT_OFF_SECONDS, Generation, Handover
from respawn.schema import (Heartbeat, JobCounters, JobEvent, JobSpec, JobStatus, MemberStatus, NodeState, SlotStatus,
                            State)

from . import alerts, costs, decide as core, losses, membership, outcomes, recovery_time
from .actions import NONE, POLL, Act, Action, Decision
from .observation import ABSENT, NodeObs, Observation, Phase, current_heartbeat, noticed
from .outcomes import Followup, Outcome, OutcomeKind

_COUNTERS = tuple(JobCounters.model_fields)  # the job's, whichever slot's decision changed them
_MEMBER = tuple(MemberStatus.model_fields)
# The job's summary a member has too (JobStatus's top level: state, message, node, zone, provisioning, tried_zones
# and the recovery's fields; attempt is the newest of any slot's). A job that forms no generation is summed up by its
# one member: it trains, recovers and ends as that member does.
_SUMMARY = tuple(k for k in JobStatus.model_fields if k in MemberStatus.model_fields and k != "attempt")


class JobAct(str, enum.Enum):
    """The job's own actions (the slots' are actions.Act's)."""

    SET_GENERATION = "set_generation"
    DELETE_NODES = "delete_nodes"


@dataclass(frozen=True)
class SetGeneration:
    """Write generation `value` (its JSON) into the metadata of each member of `targets` (slot, zone, node) at once."""

    value: str
    targets: tuple[tuple[int, str, str], ...]
    kind: JobAct = JobAct.SET_GENERATION


@dataclass(frozen=True)
class DeleteNodes:
    """Delete every node of `targets` (slot, zone, node) at once: the nodes a job leaves in one pass (it ended, it
    stopped at its budget, it moves), so that none waits for another's soft-off, nor for the sweep's orphan scan."""

    targets: tuple[tuple[int, str, str], ...]
    kind: JobAct = JobAct.DELETE_NODES


@dataclass(frozen=True)
class MemberObs:
    """What reconcile observed of one member slot's node."""

    node: NodeObs = ABSENT
    heartbeat: Heartbeat | None = None  # nodes/{node}
    address: str | None = None  # the API's internal IP of a running node
    hint: str | None = None  # the cause an event gave for this node
    leaving: NodeObs | None = None  # the node the slot replaced during its notice (None: the slot has none)
    leaving_heartbeat: Heartbeat | None = None  # that node's heartbeat: its final one tells how its save ended


def needs_address(spec: JobSpec | None, m: MemberStatus, node: NodeObs) -> bool:
    """Whether reconcile asks the API for a member's internal address: a running member of a job that forms
    generations (its master's address is the generation's), until its address is recorded."""
    return (spec is not None and membership.forms_generations(spec.slots) and node.phase is Phase.RUNNING
            and m.address is None)


def slots(s: JobStatus, nodes: int) -> list[MemberStatus]:
    """The member slots as recorded, one per node (empty ones on the job's first handling)."""
    return [*s.members[:nodes], *(MemberStatus() for _ in range(nodes - len(s.members)))]


def project(s: JobStatus, i: int, nodes: int | None = None) -> SlotStatus:
    """Member slot `i` as decide.decide sees it: its own node's life, the job's counters."""
    member = slots(s, nodes if nodes is not None else len(s.members))[i]
    return SlotStatus(**{k: getattr(member, k) for k in _MEMBER}, **{k: getattr(s, k) for k in _COUNTERS})


def generation(s: JobStatus) -> Generation | None:
    if s.generation is None:
        return None
    handover = tuple(Handover(h["node"], h["until"]) for h in s.generation.get("handover") or ())
    return Generation(s.generation["number"], tuple(s.generation["members"]), s.generation["master_addr"], handover)


def _as_data(g: Generation) -> dict[str, Any]:
    data = {"number": g.number, "members": list(g.members), "master_addr": g.master_addr}
    if g.handover:
        data["handover"] = [{"node": h.node, "until": h.until} for h in g.handover]
    return data


def _aggregate(s: JobStatus) -> JobStatus:
    """The job's state and node from its members: RUNNING while every member of the generation runs; PREEMPTED
    while a member the platform took is being deleted (or the job moves), RESTARTING while a member that failed is
    (or waits out its backoff); WAITING_FOR_CAPACITY when every slot waits for capacity; else
    PROVISIONING (PENDING before anything was placed). `node`: the master's, else slot 0's."""
    if s.state.terminal:
        return s
    states = [m.state for m in s.members]
    g = generation(s)
    by_node = {m.node: m for m in s.members if m.node}
    if g is not None and not s.moving and all(n in by_node and by_node[n].state is State.RUNNING for n in g.members):
        state = State.RUNNING
    elif s.moving or State.PREEMPTED in states:
        state = State.PREEMPTED
    elif State.RESTARTING in states:
        state = State.RESTARTING
    elif State.WAITING_FOR_CAPACITY in states and all(x in (State.WAITING_FOR_CAPACITY, State.PENDING) for x in states):
        state = State.WAITING_FOR_CAPACITY  # nothing placed: the placing slot waits for capacity
    elif all(x is State.PENDING for x in states):
        state = State.PENDING
    else:
        state = State.PROVISIONING
    node = g.members[0] if g is not None and g.members[0] in by_node else (s.members[0].node if s.members else None)
    return s.model_copy(update={"state": state, "node": node})


def merge(s: JobStatus, i: int, slot: SlotStatus, nodes: int) -> JobStatus:
    """The job's status with slot `i` as decided (`slot`): its counters go to the job, its node's life to member
    `i`; a member with a new node (or a new life of it) has no known address and has been given no generation;
    slot 0 placing the job alone carries the job's zone with it. A one-node job's top level repeats its slot."""
    members = slots(s, nodes)
    old = members[i]
    member = MemberStatus(**{k: getattr(slot, k) for k in _MEMBER})
    if (member.node, member.node_started_at) != (old.node, old.node_started_at):
        member = member.model_copy(update={"address": None, "generation_sent": 0})
    members[i] = member
    job = s.model_copy(update={**{k: getattr(slot, k) for k in _COUNTERS}, "members": members,
                               "attempt": max(s.attempt, member.attempt)})
    if not membership.forms_generations(nodes):
        return job.model_copy(update={k: getattr(member, k) for k in _SUMMARY})
    if i == 0 and not any(_holds(m) for m in members[1:]):
        job = job.model_copy(update={"zone": member.zone, "provisioning": member.provisioning,
                                     "tried_zones": list(member.tried_zones)})
    if member.state.terminal:
        return job.model_copy(update={"state": member.state, "message": member.message, "recovering": False,
                                      "exit_code": member.exit_code})
    return _aggregate(job.model_copy(update={"message": member.message[:1000]}))


def _holds(m: MemberStatus) -> bool:
    """The slot holds a node in the job's zone (being created, running, or lost and being deleted), as opposed to a
    slot never filled, or whose last create was refused (it still names that node, which never came to be)."""
    return (m.node is not None and m.create_state in ("pending", "starting", "created")
            and m.state in (State.PROVISIONING, State.RUNNING, State.PREEMPTED, State.RESTARTING))


def _upd(s: JobStatus, now: datetime, **changes: Any) -> JobStatus:
    return s.model_copy(update={**changes, "updated_at": now, "revision": s.revision + 1})


def _slot_observation(o: Observation, spec: JobSpec, members: Sequence[MemberStatus], i: int, seen: MemberObs
                      ) -> Observation:
    """Slot `i` as decide.decide sees it: the job's spec, the slot (membership.slot_of: the job's zone alone once
    the job has one; slot 0 placing the job alone walks the whole list), its node's life and the job's counters."""
    s = o.status
    placing = i == 0 and not any(_holds(m) for m in members[1:])
    used = costs.spent(s, o.now)[0] / spec.budget.max_usd if spec.budget is not None else None
    return replace(o, slot=membership.slot_of(spec, i, None if placing else s.zone), status=project(s, i, len(members)),
                   node=seen.node, heartbeat=seen.heartbeat, hint=seen.hint, next_attempt=s.attempt + 1,
                   budget_used=used, leaving=seen.leaving, leaving_heartbeat=seen.leaving_heartbeat)


def _delete_any(o: Observation, members: list[MemberStatus], seen: Sequence[MemberObs]
                ) -> tuple[Action | DeleteNodes, list[MemberStatus]]:
    """The delete of every node the job leaves, all in this pass (DeleteNodes; one node: the slot's delete), POLL
    while one is being deleted and none is left to ask, else NONE; and the members to commit with it. A node a
    member replaced during its notice (`leaving`) goes too, unobserved (a delete of a node gone answers 404: done);
    the members committed with its delete no longer name it."""
    gone = [(i, m.leaving) for i, m in enumerate(members) if m.leaving is not None]
    there = [(i, m) for i, (m, ob) in enumerate(zip(members, seen))
             if ob.node.present and ob.node.phase is not Phase.DELETING and m.node and m.zone]
    left = [m.model_copy(update={"leaving": None}) if m.leaving is not None else m for m in members]
    nodes = [(i, x.zone, x.node, x.attempt) for i, x in [*gone, *there]]
    if len(nodes) == 1:
        [(i, zone, node, attempt)] = nodes
        return Action(Act.DELETE, zone=zone, node=node, attempt=attempt, slot=i), left
    if nodes:
        return DeleteNodes(tuple((i, zone, node) for i, zone, node, _ in nodes)), left  # type: ignore[misc]
    deleting = any(ob.node.phase is Phase.DELETING for ob in seen)
    return (POLL if deleting else NONE), left


def decide(o: Observation, seen: Sequence[MemberObs]) -> Decision:
    """The job's decision; `seen`: one MemberObs per slot (as recorded in status.members). Its node lives booked in
    the cost ledger (functions/costs.py), a budget alert due sent when the decision sends none, and the cost so far
    on the alert."""
    d = _progressed(o, seen, _decide(o, seen))
    s, now, spec = o.status, o.now, o.spec
    status = costs.account(s, d.status, now, o.quote) if d.status is not None else None
    alert = d.alert
    budget = spec.budget if spec is not None else None
    after = status if status is not None else s
    if budget is not None and alert is None and not after.state.terminal:
        due = costs.alert_due(after, budget.max_usd, now)
        if due is not None:
            usd = costs.spent(after, now)[0]
            alert = alerts.told("budget", o.job_id, now, spent_usd=usd, percent=due, budget_usd=budget.max_usd)
            ledger = after.cost.model_copy(update={"alerted_percent": due})
            status = (status.model_copy(update={"cost": ledger}) if status is not None
                      else _upd(after, now, cost=ledger))  # one revision per write
    if alert is not None:
        alert = {**alert, **costs.alert_fields(status if status is not None else s, now)}
    return replace(d, status=status, alert=alert)


def _slot_count(o: Observation) -> int:
    return o.spec.slots if o.spec is not None else max(len(o.status.members), 1)


def _padded(seen: Sequence[MemberObs], nodes: int) -> list[MemberObs]:
    return [*seen[:nodes], *(MemberObs() for _ in range(nodes - len(seen)))]


def _beats(s: JobStatus, seen: Sequence[MemberObs], nodes: int) -> list[Heartbeat | None]:
    """Each member slot's heartbeat of its current node's current life (observation.current_heartbeat), else None."""
    return [current_heartbeat(ob.heartbeat, m) for m, ob in zip(slots(s, nodes), _padded(seen, nodes))]


def _progressed(o: Observation, seen: Sequence[MemberObs], d: Decision) -> Decision:
    """Decision `d` with the job's progress (`progress`, from its members' heartbeats as observed) written along,
    or alone when `d` writes nothing: the one place the progress is written. Not once the job has ended."""
    s = o.status
    if s.state.terminal:
        return d
    after = d.status if d.status is not None else s
    changes = progress(after, _beats(s, seen, _slot_count(o)))  # type: ignore[arg-type]
    if not changes:
        return d
    return replace(d, status=after.model_copy(update=changes) if d.status is not None else _upd(s, o.now, **changes))


def _decide(o: Observation, seen: Sequence[MemberObs]) -> Decision:
    s, now, spec = o.status, o.now, o.spec
    nodes = _slot_count(o)
    members = slots(s, nodes)
    seen = _padded(seen, nodes)

    if s.state is State.BUDGET_EXHAUSTED and spec is not None and not o.cancel_requested and (
            spec.budget is None or spec.budget.max_usd > (s.cost.stopped_at_budget_usd or 0)
            and not costs.over_budget(s, spec.budget.max_usd, now, o.settings.budget_lookahead_seconds)):
        return _resume(o, members, seen)
    if s.state.terminal:  # nothing may keep billing after the end
        a, left = _delete_any(o, members, seen)
        return Decision(a, _upd(s, now, members=left) if left != members else None)
    if spec is None or o.cancel_requested:
        a, left = _delete_any(o, members, seen)
        base = _upd(s, now, members=left)
        if spec is None:
            msg = "invalid job spec: " + "; ".join(o.spec_errors)
            alert = alerts.told("invalid_spec", o.job_id, now, said=msg, errors=list(o.spec_errors))
            return Decision(a, base.model_copy(update={"state": State.INVALID, "message": msg}), "invalid_spec", alert)
        return Decision(a, base.model_copy(update={"state": State.CANCELLED, "message": "cancelled by the user"}),
                        "cancel_requested")
    if spec.budget is not None and costs.over_budget(s, spec.budget.max_usd, now, o.settings.budget_lookahead_seconds):
        return _exhausted(o, spec.budget.max_usd, members, seen)

    views = [_slot_observation(o, spec, members, i, seen[i]) for i in range(nodes)]  # each slot as a one-node job
    if not membership.forms_generations(nodes):  # one node trains alone: its slot's decision is the job's
        return _lift(core.decide(views[0]), s, 0, nodes)
    g = generation(s)
    beats = _beats(s, seen, nodes)
    if _finished(g, members, beats):
        committed = progress(s, beats).get("last_committed_step", s.last_committed_step)
        a, left = _delete_any(o, members, seen)
        st = _upd(s, now, members=left, state=State.SUCCEEDED, message="every member's trainer exited 0",
                  exit_code=0, recovering=False)
        # A generation that stepped and finished before a reconcile told its recovery: the end tells it. Survivors
        # that finished the run the loss found them in resumed nothing: the end says nothing was lost.
        by_node = {m.node: hb for m, hb in zip(members, beats) if m.node}
        ranks = [by_node.get(n) for n in g.members] if g is not None else []
        told, words = core.ended_recovery(s, ranks)
        if "steps_lost" in told:
            st = st.model_copy(update={"steps_lost": told["steps_lost"], "message": st.message + words})
        alert = alerts.told("succeeded", o.job_id, now, s=s, committed_step=committed, recovery=told, words=words,
                            every_node=True)
        return Decision(a, st, "trainer_succeeded", alert, told)

    if s.moving:
        return _move(o, members, seen)

    waits: list[Action] = []
    for i in range(nodes):
        if i > 0 and not any(_holds(m) for m in members):
            break  # slot 0 places the job first
        d = core.decide(views[i])
        if d.status is not None and d.status.state is State.SUCCEEDED:
            continue  # this member is done; the job is when every member of its generation is (above)
        if d.status is None and d.action.kind in (Act.NONE, Act.WAIT, Act.POLL):
            waits.append(d.action)
            continue
        return _spare_first(o, spec, members, seen, beats, i, d)
    return _membership(o, spec, members, seen, beats, waits)


# A slot's decisions after a loss that the next pass derives again from what it observes, unchanged: the create of
# the node committed `pending` (same name, same attempt: a create that did happen answers 409 and is adopted), the
# delete of the lost node, the start of a node restarted in place, the wait of a backoff.
_DEFERRABLE = (Act.CREATE, Act.DELETE, Act.START, Act.WAIT)


def _spare_first(o: Observation, spec: JobSpec, members: list[MemberStatus], seen: Sequence[MemberObs],
                 beats: Sequence[Heartbeat | None], i: int, d: Decision) -> Decision:
    """Slot `i`'s decision `d` as the job's; when it is the loss of a member of the generation and the slots left
    serving form a new generation (a warm spare in the lost member's place, or an elastic job's survivors), that
    generation is committed with the loss in this same pass and written to its members (SetGeneration, its
    Handover naming the member still saving during its notice), and the slot's own action (the replacement's
    create, the lost node's delete) is left to the next pass, which derives it again from the status committed
    here: the replacement's name and attempt are committed once, its create is issued once (a repeat answers 409).
    So a spare never waits for its own replacement's create. Only for a lost node that is gone, off, or in its notice
    (the generation's handover waits for its save): one still up without a notice (cut off, stopping) is deleted
    first, as before, its soft-off saving before any spare restores."""
    s = o.status
    lifted = _lift(d, s, i, len(members))
    old, previous = members[i], generation(s)
    after = lifted.status
    if (after is None or d.status is None or previous is None or s.moving or old.node not in previous.members
            or d.action.kind not in _DEFERRABLE or after.state.terminal or not d.status.recovering
            or d.status.preempted_at == old.preempted_at):
        return lifted
    left = slots(after, len(members))
    views = [membership.SlotView(j, m.node if ob.node.present and j != i else None,
                                 j != i and _serving(m, ob, hb, o), m.address,
                                 m.provisioning or membership.slot_provisioning(spec, j),
                                 m.state is State.WAITING_FOR_CAPACITY)
             for j, (m, ob, hb) in enumerate(zip(left, seen, beats))]
    p = membership.plan(spec, views, previous)
    g = p.generation
    if p.step is not membership.Step.RUN or g is None or g.number == previous.number or old.node in g.members:
        return lifted
    reached = {**after.model_dump(include=set(_PROGRESS)), **progress(after, beats)}
    step, committed = reached["last_step"] or 0, reached["last_committed_step"] or 0
    g = replace(g, handover=_handover(o, spec, left, seen, beats, previous, g))
    if seen[i].node.phase not in (Phase.ABSENT, Phase.DEAD) and old.node not in {h.node for h in g.handover}:
        return lifted  # a live node no handover waits for (cut off, stopping): its delete's soft-off saves first
    message = f"{_running_message(g, s.zone)} ({p.reason}); then slot {i}: {left[i].message}"
    st = _aggregate(after.model_copy(update={"generation": _as_data(g), "steps_lost": max(step - committed, 0)}))
    st = st.model_copy(update={"message": message[:1000]})
    targets = tuple((j, m.zone, m.node) for j, m in enumerate(left) if m.node in g.members and m.zone)
    details = {**lifted.details, "generation": g.number, "members": list(g.members), "master_addr": g.master_addr,
               "then": d.action.kind.value}
    write = SetGeneration(g.to_json(), targets)
    return Decision(write, st, lifted.cause, lifted.alert, details)  # type: ignore[arg-type]


def _exhausted(o: Observation, cap: float, members: list[MemberStatus], seen: Sequence[MemberObs]) -> Decision:
    """The job's cost reaches its budget before the next look: every node is deleted in this pass, as a cancel deletes
    them (the delete is the guest's soft-off: its agent's notice path saves the emergency checkpoint),
    BUDGET_EXHAUSTED."""
    s, now = o.status, o.now
    a, left = _delete_any(o, members, seen)
    usd = costs.spent(s, now)[0]
    msg = (f"budget exhausted: {prices.usd(usd)} of {prices.usd(cap)} spent; every node deleted (each saves an emergency "
           f"checkpoint in its shutdown). Raise the budget to go on from the newest committed checkpoint: respawn "
           f"jobs resume {o.job_id} --budget USD")
    st = _upd(s, now, members=left, state=State.BUDGET_EXHAUSTED, message=msg, recovering=False,
              cost=s.cost.model_copy(update={"alerted_percent": 100, "stopped_at_budget_usd": cap}))
    alert = alerts.told("budget_exhausted", o.job_id, now, said=msg, budget_usd=cap)
    return Decision(a, st, "budget_exhausted", alert, {"budget_usd": cap})


def _resume(o: Observation, members: list[MemberStatus], seen: Sequence[MemberObs]) -> Decision:
    """A BUDGET_EXHAUSTED job whose budget was raised (or dropped): once none of its nodes is left, it starts again
    from the beginning of placement (PENDING), keeping its counters and ledger; its trainer resumes from the newest
    committed checkpoint."""
    s, now, spec = o.status, o.now, o.spec
    a, left = _delete_any(o, members, seen)
    if a.kind is not Act.NONE:
        return Decision(a, _upd(s, now, members=left) if left != members else None)
    cap = prices.usd(spec.budget.max_usd) if spec is not None and spec.budget is not None else "no budget"
    st = _upd(s, now, state=State.PENDING, members=[], node=None, zone=None, provisioning=None, tried_zones=[],
              recovering=False, generation=None, moving=False,
              message=f"budget raised ({cap}): placing the job again; it resumes from the newest committed checkpoint",
              cost=s.cost.model_copy(update={"alerted_percent": 0, "stopped_at_budget_usd": None}))
    return Decision(NONE, st, "budget_raised", None, {"budget_usd": spec.budget.max_usd if spec and spec.budget else None})


_PROGRESS = ("last_step", "last_committed_step", "total_steps")


def progress(s: JobStatus, beats: Sequence[Heartbeat | None]) -> dict[str, Any]:
    """The job's progress from its members' heartbeats, as changes to `s` (the status the decision leaves): the
    furthest step, the newest committed step (the commit is job-wide: every rank's files are remote), the total,
    each as its furthest member reports it. Written by every path of the decision, and only here (_progressed): a
    slot writing its own would undo another member's a step apart, pass after pass."""
    out: dict[str, Any] = {}
    for field, reported in (("last_step", "step"), ("last_committed_step", "committed_step"),
                            ("total_steps", "total_steps")):
        values = [getattr(hb, reported) for hb in beats if hb is not None and getattr(hb, reported) is not None
                  # while recovering, the furthest step before it stays (its steps lost: recovery_time)
                  and not (field == "last_step" and recovery_time.resumed_run(hb, s.recovering, s.preempted_at))]
        if field == "last_step" and s.recovering and s.last_step is not None and values and max(values) < s.last_step:
            continue  # nor goes back to a survivor's older report
        if values and max(values) != getattr(s, field):
            out[field] = max(values)
    return out


def _lift(d: Decision, s: JobStatus, i: int, nodes: int) -> Decision:
    """A slot's decision as the job's. A one-node job's is the job's as it stands. Of several nodes, a member's loss
    starts the job's recovery (its downtime counts from the first loss); the job's alerts are its own: a slot's
    `recovered` (its node reports) is not the job training again (_recovered says that), and a slot refused in
    the job's zone is not the job waiting for capacity unless that slot is placing the job."""
    status = merge(s, i, d.status, nodes) if d.status is not None else None  # type: ignore[arg-type]
    action = replace(d.action, slot=i) if d.action.kind not in (Act.NONE, Act.POLL, Act.WAIT) else d.action
    if not membership.forms_generations(nodes):
        return Decision(action, status, d.cause, d.alert, d.details)
    old = slots(s, nodes)[i]
    if status is not None and d.status is not None and d.status.recovering and d.status.preempted_at != old.preempted_at:
        status = status.model_copy(update={
            "recovering": True, "last_cause": d.cause, "preempted_at": s.preempted_at if s.recovering else d.status.preempted_at,
            "preempted_zone": s.preempted_zone if s.recovering else s.zone, "last_error": d.status.last_error,
            "emergency": d.status.emergency if d.status.emergency is not None or not s.recovering else s.emergency})
    elif status is not None and d.status is not None and d.status.emergency != old.emergency and d.status.emergency:
        status = status.model_copy(update={"emergency": d.status.emergency})  # the leaving member's save, told late
    alert = d.alert
    placing = i == 0 and not any(_holds(m) for m in slots(s, nodes)[1:])
    if alert is not None and (alert["type"] == "recovered" or (alert["type"] == "waiting_for_capacity" and not placing)):
        alert = None
    return Decision(action, status, d.cause, alert, {**d.details, "slot": i})


def _finished(g: Generation | None, members: Sequence[MemberStatus], beats: Sequence[Heartbeat | None]) -> bool:
    """The training is done: a member's trainer exited 0 having committed the last step (in the remote store, so
    after every rank's files: the other members may go, even if a newer generation was formed meanwhile), or
    every member of the generation exited 0."""
    exited = [hb for hb in beats if hb is not None and hb.state is NodeState.EXITED and hb.exit_code == 0]
    if any(hb.total_steps is not None and hb.committed_step == hb.total_steps for hb in exited):
        return True
    by_node = {m.node: hb for m, hb in zip(members, beats) if m.node}
    return g is not None and all((hb := by_node.get(n)) is not None and hb.state is NodeState.EXITED
                                 and hb.exit_code == 0 for n in g.members)


def _serving(m: MemberStatus, ob: MemberObs, hb: Heartbeat | None, o: Observation) -> bool:
    """The member runs and its agent, prepared, beats (waiting for a generation or training in one)."""
    return (m.state is State.RUNNING and ob.node.phase is Phase.RUNNING and hb is not None
            and hb.state in (NodeState.WAITING, NodeState.TRAINING)
            and (o.now - hb.heartbeat_at).total_seconds() <= o.settings.stale_heartbeat_seconds)


def _membership(o: Observation, spec: JobSpec, members: list[MemberStatus], seen: Sequence[MemberObs],
                beats: Sequence[Heartbeat | None], waits: Sequence[Action]) -> Decision:
    s, now = o.status, o.now
    if not any(_holds(m) for m in members):  # slot 0 has not placed the job (it waits for capacity): no membership
        return _settle(o, members, waits)
    # A running member's address, once the API shows it (the master's is the generation's master address).
    learned = [m.model_copy(update={"address": ob.address}) if m.state is State.RUNNING and ob.address
               and ob.address != m.address else m for m, ob in zip(members, seen)]
    if learned != members:
        return Decision(NONE, _upd(s, now, members=learned))
    views = [membership.SlotView(i, m.node if ob.node.present else None, _serving(m, ob, hb, o), m.address,
                                 m.provisioning or membership.slot_provisioning(spec, i),
                                 m.state is State.WAITING_FOR_CAPACITY)
             for i, (m, ob, hb) in enumerate(zip(members, seen, beats))]
    previous = generation(s)
    p = membership.plan(spec, views, previous)
    if p.step is membership.Step.MOVE:
        st = _upd(s, now, members=members, moving=True, state=State.PREEMPTED, message=p.reason,
                  tried_zones=[*s.tried_zones, *([s.zone] if s.zone else [])], recovering=True,
                  preempted_zone=s.preempted_zone if s.recovering else s.zone,
                  preempted_at=s.preempted_at if s.recovering else now)
        return Decision(NONE, st, "move", None, {"zone": s.zone})
    if p.step is membership.Step.RUN and p.generation is not None:
        g = p.generation
        if previous is None or g.number != previous.number:
            lost = {}
            if s.recovering:  # what the new generation loses: it resumes from the newest committed step
                reached = {**s.model_dump(include=set(_PROGRESS)), **progress(s, beats)}
                step, committed = reached["last_step"] or 0, reached["last_committed_step"] or 0  # None: nothing yet
                lost = {"steps_lost": max(step - committed, 0)}
            g = replace(g, handover=_handover(o, spec, members, seen, beats, previous, g))
            return _new_generation(o, members, g, p.reason, cause="generation", **lost)
        ended = _ended(g, members, beats)
        if len(ended) == len(g.members) or any(_crashed(hb) for _, hb in ended):
            # Every trainer ended, or one crashed: the others are blocked in a collective with it (until the
            # process group's timeout) or failing too, so they restart soon rather than when each has given up.
            return _crash_settling(o, members, g, ended) or _restart_generation(o, spec, members, g, ended)
        idle = stalled(o.settings.progress_timeout_seconds, g, members, beats, now)
        if idle is not None:
            return _unstick(o, spec, members, seen, beats, g, idle)
        behind = tuple((i, m.zone, m.node) for i, m in enumerate(members)
                       if m.node in g.members and m.zone and m.generation_sent < g.number)
        if behind:  # every member behind at once: they restart together, and the writes run side by side
            return Decision(SetGeneration(g.to_json(), behind))  # type: ignore[arg-type]
        if s.recovering and _training(g, members, beats):
            by_node = {m.node: hb for m, hb in zip(members, beats) if m.node}
            back = recovery_time.measure(s.last_cause, s.preempted_at, s.last_step,
                                         [by_node[n] for n in g.members])  # type: ignore[misc]
            if back is not None:  # every rank of the generation steps again
                return _recovered(o, spec, members, g, back)
    full = p.step is membership.Step.RUN and p.generation is not None and p.generation.world_size == spec.nodes
    message = p.reason if p.step is not membership.Step.RUN else _running_message(p.generation, s.zone)
    return _settle(o, members, waits, message, tried_zones=[] if full else s.tried_zones)


def _handover(o: Observation, spec: JobSpec, members: Sequence[MemberStatus], seen: Sequence[MemberObs],
              beats: Sequence[Heartbeat | None], previous: Generation | None, g: Generation) -> tuple[Handover, ...]:
    """The members of `previous` that `g` leaves out while they may still be saving during their notice: a node
    replaced during its notice (`leaving`), or a slot's node that saw a notice and still runs. A member that
    starts a trainer in `g` waits for them (a spare taking a noticed member's place restores its emergency save)."""
    if previous is None:
        return ()
    window = timedelta(seconds=spec.notice_seconds + SOFT_OFF_SECONDS)
    out = []
    for m, ob, hb in zip(members, seen, beats):
        gone = m.leaving
        if gone is not None and gone.node in previous.members and gone.node not in g.members and o.now < gone.until:
            out.append(Handover(gone.node, gone.until.isoformat()))
        elif (m.node in previous.members and m.node not in g.members and hb is not None and noticed(hb)
              and ob.node.phase in (Phase.RUNNING, Phase.STOPPING)):
            out.append(Handover(m.node, (o.now + window).isoformat()))
    return tuple(out)


def _settle(o: Observation, members: list[MemberStatus], waits: Sequence[Action], message: str | None = None,
            **changes: Any) -> Decision:
    """Nothing to act on: commit the job's aggregate state when it changed, else wait as the slots do."""
    s = o.status
    target = _aggregate(s.model_copy(update={"members": members, **changes}))
    keys = ("state", "node", "members", "tried_zones")
    if any(getattr(target, k) != getattr(s, k) for k in keys):
        return Decision(NONE, _upd(target, o.now, message=(message or target.message)[:1000]), "membership")
    untils = [a.until for a in waits if a.kind is Act.WAIT and a.until is not None]
    if any(a.kind is Act.POLL for a in waits):
        return Decision(POLL)
    return Decision(Action(Act.WAIT, until=min(untils)) if untils else NONE)


def _running_message(g: Generation | None, zone: str | None) -> str:
    assert g is not None
    return f"generation {g.number}: {g.world_size} nodes in {zone}, master {g.members[0]} ({g.master_addr})"


def _training(g: Generation, members: Sequence[MemberStatus], beats: Sequence[Heartbeat | None]) -> bool:
    """Every member of generation `g` trains in it."""
    by_node = {m.node: hb for m, hb in zip(members, beats) if m.node}
    return all((hb := by_node.get(n)) is not None and hb.state is NodeState.TRAINING and hb.generation == g.number
               for n in g.members)


def _recovered(o: Observation, spec: JobSpec, members: list[MemberStatus], g: Generation,
               back: recovery_time.Recovery) -> Decision:
    """The job steps again after a loss (a member replaced, an elastic world formed, a move): one alert for the
    recovery, however many nodes it took, with its time and what the resumed generation lost (recovery_time)."""
    s, now = o.status, o.now
    alert = alerts.told("generation_recovered", o.job_id, now, s=s, back=back, generation=g.number,
                        world_size=g.world_size, nodes=spec.nodes)
    return Decision(NONE, _upd(s, now, members=members, recovering=False, steps_lost=back.steps_lost), "recovered",
                    alert, {"generation": g.number, **back.fields(), **losses.loss_words(s, "emergency")})


def _new_generation(o: Observation, members: list[MemberStatus], g: Generation, reason: str, cause: str,
                    **changes: Any) -> Decision:
    s = o.status
    st = _aggregate(_upd(s, o.now, members=members, generation=_as_data(g), crash_seen_at=None, **changes))
    st = st.model_copy(update={"message": f"{_running_message(g, s.zone)} ({reason})"[:1000]})
    return Decision(NONE, st, cause, None, {"generation": g.number, "members": list(g.members),
                                            "master_addr": g.master_addr})


def _ended(g: Generation, members: Sequence[MemberStatus], beats: Sequence[Heartbeat | None]
           ) -> list[tuple[str, Heartbeat]]:
    """The members of generation `g` that ran it and wait again (their trainer ended), with their heartbeats."""
    by_node = {m.node: hb for m, hb in zip(members, beats) if m.node}
    return [(n, hb) for n in g.members if (hb := by_node.get(n)) is not None and hb.state is NodeState.WAITING
            and hb.generation == g.number]


def _crashed(hb: Heartbeat) -> bool:
    """The member's trainer exited with an error of its own: not 0, not a stop on the notice (75, 76), no notice seen."""
    return hb.exit_code not in (0, *EXITS_ON_NOTICE, None) and hb.notice is None


# A crash seen while other members of the generation still run: how long their exits are waited for (polled) before
# the generation restarts without them. The member that raised may report after a peer whose collective broke under
# it (0.4 s later, seen in a 3-node gloo job); waiting lets the alert name the one that raised, with its own error.
CRASH_SETTLE_SECONDS = 5.0


def _crash_settling(o: Observation, members: list[MemberStatus], g: Generation,
                    ended: Sequence[tuple[str, Heartbeat]]) -> Decision | None:
    """Polled while a member of `g` has crashed and others still run, for CRASH_SETTLE_SECONDS from the first sight
    (recorded: crash_seen_at); None once every member has ended or the time is up: restart then."""
    s, now = o.status, o.now
    if len(ended) == len(g.members):
        return None
    if s.crash_seen_at is None:
        return Decision(POLL, _upd(s, now, members=members, crash_seen_at=now))
    return Decision(POLL) if now < s.crash_seen_at + timedelta(seconds=CRASH_SETTLE_SECONDS) else None


def _restart_generation(o: Observation, spec: JobSpec, members: list[MemberStatus], g: Generation,
                        ended: Sequence[tuple[str, Heartbeat]]) -> Decision:
    """Every member's trainer ended in the current generation, or one crashed, while every member serves: the same
    members train again in a new generation (the agents stop the trainers still running). Every trainer stopped by
    a notice (exit 75: the node survived it) is no crash; otherwise it is one failure (past max_failures the job
    fails). No backoff: no node is made, and max_failures bounds a trainer that crashes at every start."""
    # The members whose error is their own first: a peer's broken collective is what their crash did to it.
    crashed = sorted(((n, hb) for n, hb in ended if _crashed(hb)),
                     key=lambda x: losswords.broken_collective(x[1].output_tail))
    again = Generation(g.number + 1, g.members, g.master_addr)
    if not crashed:
        return _new_generation(o, members, again, "every trainer stopped; training again", cause="generation")
    worst = crashed[0][1]
    on = ", ".join(n for n, _ in crashed)
    return _restart_failed(o, spec, members, g, "trainer_crashed", f"trainer exited {worst.exit_code} on {on}",
                           exit_code=worst.exit_code, output_tail=worst.output_tail)


def _restart_failed(o: Observation, spec: JobSpec, members: list[MemberStatus], g: Generation, cause: str, why: str,
                    exit_code: int | None = None, output_tail: str | None = None) -> Decision:
    """The same members train again in a new generation after a failure of theirs (a crash, a stall): one failure
    against max_failures (past it the job fails), preemptions not counted. No backoff: no node is made, and
    max_failures bounds a trainer that fails at every start."""
    s, now = o.status, o.now
    counts = dict(restarts=s.restarts + 1, failures=s.failures + 1, failure_streak=s.failure_streak + 1)
    error = losswords.last_error(output_tail)
    tallies = dict(failures=counts["failures"], preemptions=s.preemptions, attempt=s.attempt, cause=cause,
                   exit_code=exit_code, output_tail=output_tail, **({"last_error": error} if error else {}))
    words = {"last_error": error} if error else {}
    if counts["failures"] > spec.max_failures:
        # The count the status records (this failure included): the message and `failures` say one number.
        msg = (f"gave up after {losses.counted(counts['failures'], 'failure')}, more than max_failures "
               f"({spec.max_failures}) (last cause: {cause}: {why}{'; last error: ' + error if error else ''}); "
               "preemptions are not counted")
        st = _upd(s, now, members=members, state=State.FAILED, message=msg[:1000], exit_code=exit_code,
                  recovering=False, failures=counts["failures"], last_cause=cause, last_error=error, emergency=None)
        alert = alerts.told("failed", o.job_id, now, said=msg, restarts=s.restarts, **tallies)
        return Decision(NONE, st, cause, alert, {"max_failures": spec.max_failures, **words})
    alert = alerts.told("generation_crashed", o.job_id, now, generation=g.number, why=why, restarts=counts["restarts"],
                        **tallies)
    again = Generation(g.number + 1, g.members, g.master_addr)
    d = _new_generation(o, members, again, why + (f": {error}" if error else ""), cause=cause, exit_code=exit_code,
                        last_cause=cause, last_error=error, emergency=None, **counts)
    return Decision(d.action, d.status, d.cause, alert, {**d.details, **words})


# The stall rule: a generation whose step stopped while every member trains in it and beats (a network partition:
# the collective hangs, the heartbeats go on). The member cut off is replaced (restarting everyone with it would
# hang again); with no member to blame, the generation restarts. Either counts as a failure against the job's
# budget, so a stall that keeps coming back ends the job rather than looping.
STALLED = "trainer_stalled"
UNREACHABLE = "unreachable"


def stalled(timeout: float, g: Generation, members: Sequence[MemberStatus], beats: Sequence[Heartbeat | None],
            now: datetime) -> float | None:
    """Seconds generation `g` has not stepped, when that is at least `timeout` (> 0) and every member trains in it
    and says how long its step has been idle (its beat's step_idle_seconds, aged by the beat's age); else None."""
    if timeout <= 0:
        return None
    by_node = {m.node: hb for m, hb in zip(members, beats) if m.node}
    idle = []
    for n in g.members:
        hb = by_node.get(n)
        if (hb is None or hb.state is not NodeState.TRAINING or hb.generation != g.number
                or hb.step_idle_seconds is None):
            return None
        idle.append(hb.step_idle_seconds + max(0.0, (now - hb.heartbeat_at).total_seconds()))
    return min(idle) if min(idle) >= timeout else None


def cut_off(g: Generation, members: Sequence[MemberStatus], beats: Sequence[Heartbeat | None]) -> list[str]:
    """The members of a stalled generation to replace, from who reaches its master (each member other than the
    master probes it): those that do not while others do; the master when two or more members do not reach it and
    none does; with one member besides the master (who is cut off cannot be told), that member, unless its slot's
    last node was already replaced as unreachable, then the master. [] when every member reaches the master."""
    by_node = {m.node: (m, hb) for m, hb in zip(members, beats) if m.node}
    others = [n for n in g.members[1:] if n in by_node]
    lost = [n for n in others if by_node[n][1] is not None and by_node[n][1].master_reachable is False]
    reached = [n for n in others if by_node[n][1] is not None and by_node[n][1].master_reachable is True]
    if not lost:
        return []
    if reached:
        return lost
    if len(lost) >= 2 or by_node[lost[0]][0].last_cause == UNREACHABLE:
        return [g.members[0]]
    return lost


def _unstick(o: Observation, spec: JobSpec, members: list[MemberStatus], seen: Sequence[MemberObs],
             beats: Sequence[Heartbeat | None], g: Generation, idle: float) -> Decision:
    """A stalled generation: replace the member cut off (its slot's node is lost as `unreachable`, a failure), or
    restart the generation when none is to blame (`trainer_stalled`, a failure too)."""
    blamed = cut_off(g, members, beats)
    if blamed:
        i = next(i for i, m in enumerate(members) if m.node == blamed[0])
        view = _slot_observation(o, spec, members, i, seen[i])
        d = core._lose(view, view.spec, beats[i], UNREACHABLE)
        lifted = _spare_first(o, spec, members, seen, beats, i, d)
        return replace(lifted, details={**lifted.details, "stalled_seconds": round(idle, 1), "cut_off": blamed})
    d = _restart_failed(o, spec, members, g, STALLED,
                        f"generation {g.number} made no step for {idle:.0f} s while every member trains and beats")
    return replace(d, details={**d.details, "stalled_seconds": round(idle, 1)})


def _move(o: Observation, members: list[MemberStatus], seen: Sequence[MemberObs]) -> Decision:
    """The whole job leaves its zone: delete every member, then let slot 0 place the job again, outside the zones
    this round tried."""
    s = o.status
    a, left = _delete_any(o, members, seen)
    if a.kind is not Act.NONE:
        return Decision(a, _upd(s, o.now, members=left) if left != members else None)
    fresh = [MemberStatus(tried_zones=list(s.tried_zones))] + [MemberStatus() for _ in members[1:]]
    st = _upd(s, o.now, members=fresh, moving=False, zone=None, node=None, state=State.PROVISIONING,
              message=f"every node of the job deleted in {s.zone}; placing the job again (zones tried: "
                      f"{', '.join(s.tried_zones) or 'none'})")
    return Decision(NONE, st, "move")


def followup(spec: JobSpec | None, a: Action | SetGeneration | DeleteNodes, out: Outcome, now: datetime
             ) -> Followup:
    """outcomes.followup for a slot's action. A generation written is recorded on its members; a member gone
    meanwhile (404) records nothing (the next pass observes it absent); any other failure is retried by
    redelivery."""
    if isinstance(a, SetGeneration):
        k = out.kind
        return Followup(propagate=k not in (OutcomeKind.DONE, OutcomeKind.NOT_FOUND),
                        record=k is OutcomeKind.DONE)
    if isinstance(a, DeleteNodes):  # as a slot's delete: 404 is done, any other failure is retried by redelivery
        return Followup(propagate=out.kind not in (OutcomeKind.DONE, OutcomeKind.NOT_FOUND))
    return outcomes.followup(spec, a, out, now)


def after_act(job_id: str, s: JobStatus, a: Action | SetGeneration, out: Outcome, now: datetime) -> Decision:
    """outcomes.after_act for an action on member slot `a.slot`: the slot's one-node outcome, lifted to the job; a
    generation written is recorded on each of its members (unless the slot holds another node now)."""
    nodes = len(s.members)
    if isinstance(a, SetGeneration):
        number = Generation.from_json(a.value).number
        members = list(s.members)
        for i, _zone, node in a.targets:
            if 0 <= i < nodes and members[i].node == node and members[i].generation_sent < number:
                members[i] = members[i].model_copy(update={"generation_sent": number})
        return Decision(NONE, _upd(s, now, members=members)) if members != s.members else Decision(NONE)
    i = a.slot
    if i is None or not 0 <= i < nodes:
        return Decision(NONE)
    d = _lift(outcomes.after_act(job_id, project(s, i), a, out, now), s, i, nodes)
    return replace(d, status=costs.account(s, d.status, now, None)) if d.status is not None else d


def event(o: Observation, d: Decision) -> JobEvent | None:
    """The lifecycle event of a decision: a state change (of the job, or of the member slot a decision is about),
    a move to the next zone while provisioning, a generation formed, a crash, a recovery."""
    if d.status is None:
        return None
    slot = d.details.get("slot")
    if slot is not None:  # a member slot's change: an event when that slot's state changed
        before = o.status.members[slot].state if slot < len(o.status.members) else State.PENDING
        changed = before != d.status.members[slot].state or d.status.state != o.status.state
    else:
        changed = d.status.state != o.status.state or d.cause in core.TOLD_CAUSES
    if not changed and d.cause not in ("zone_refused", "zone_refused_queued", core.SAVE_OUTCOME):
        return None
    details = dict(d.details)
    member = d.status.members[slot] if slot is not None else d.status
    own = d.cause == core.SAVE_OUTCOME  # of the node that left, not of the slot's current one
    details.update({k: v for k, v in (("node", member.node), ("zone", member.zone), ("attempt", member.attempt))
                    if v and not (own and k in details)})
    return JobEvent.new(o.status.state, d.status.state, d.cause or "reconcile", **details)

