"""The decision core: a pure function from what reconcile observed of one member slot (a one-node job has one;
functions/job.py calls it for each, with the user's spec and the slot as membership.slot_of makes it) to at most
one action plus the slot's status to record. The job's progress (last_step, last_committed_step, total_steps) is
read here, written by functions/job.py alone.

All recovery policy lives here (and in placement.py and recovery.py, which it calls), including what an action's outcome means
(followup, after_act: reconcile._act only performs the call, classifies how it ended and carries out the answer).
No cloud library, no I/O, no clock: `now` is part of the observation. reconcile.py commits `Decision.status` with a
conditional write *before* it performs `Decision.action`, and every action is idempotent, so a crash or a duplicate
delivery repeats nothing harmful.

Lifecycle (docs/architecture.md): PENDING → PROVISIONING → RUNNING → SUCCEEDED; a node the platform took (preempted,
terminated, stopped, gone) → PREEMPTED while the dead node is deleted → PROVISIONING (a STOP-terminated node whose
model restarts in place may instead be started: → PROVISIONING directly); a failure of the job's own (crashed trainer,
stale heartbeat, a boot that never reported) → RESTARTING while its node is deleted and its backoff runs; every zone
refused → WAITING_FOR_CAPACITY → PROVISIONING after a backoff; FAILED past max_failures (or max_preemptions, or a preemption
rate whose action is fail), after two boots in a row whose agent never reported, or on a non-retryable error;
CANCELLED on request; INVALID when the spec does not validate (those two, and deleting a terminal job's nodes, are
the job's: functions/job.py).

A loss is a preemption (the platform took the node: preempted, host error, stopped or deleted from outside) or a
failure (the job's own: its trainer crashed, its agent went silent, or it never reported after boot: a boot
failure, with the node's serial console tail). Preemptions are recovered at once and never count against
max_failures; each failure is followed by an exponential backoff before the next node is created.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Mapping, Sequence

from respawn import losswords
from respawn.contract import SOFT_OFF_SECONDS, Handover
from respawn.control import alerts, membership, models, placement, recovery, recovery_time
from respawn.advice import ZoneAdvice
from respawn.prices import Quote
from respawn.images import IMAGE_MENTION, REQUEST_PREFIX, ImageCheck, ImageVerdict, image_help, missing_error
from respawn.schema import (CONSOLE_TAIL_CHARS, MAX_PREEMPTION_TIMES, CapacityRecord, Heartbeat, JobSpec, JobStatus,
                            Leaving, MemberStatus, NodeState, SlotStatus, State, node_name)


class Phase(str, enum.Enum):
    """A node's real state, normalised over Compute Engine instance statuses and Cloud TPU node states."""

    ABSENT = "ABSENT"  # the API says 404
    BOOTING = "BOOTING"  # PENDING, PROVISIONING, STAGING, CREATING, STARTING, RESTARTING, REIMAGING, REPAIRING
    RUNNING = "RUNNING"  # RUNNING, READY
    STOPPING = "STOPPING"  # PENDING_STOP, STOPPING, SUSPENDING, DEPROVISIONING: on its way to a dead state
    DELETING = "DELETING"
    DEAD = "DEAD"  # TERMINATED, STOPPED, SUSPENDED, PREEMPTED, HIDDEN...: not serving, must be deleted (or started)
    UNKNOWN = "UNKNOWN"


# Every compute_v1.Instance.Status value but UNDEFINED_STATUS (gcp-facts §3). PENDING: a VM waits for capacity
# before it provisions (a request of a model that waits: models/). PENDING_STOP: the guest is shutting down gracefully, before STOPPING.
# DEPROVISIONING: the VM is halted and its resources are being torn down.
GCE_PHASES = {
    "PENDING": Phase.BOOTING, "PROVISIONING": Phase.BOOTING, "STAGING": Phase.BOOTING, "RUNNING": Phase.RUNNING,
    "PENDING_STOP": Phase.STOPPING, "STOPPING": Phase.STOPPING, "SUSPENDING": Phase.STOPPING,
    "DEPROVISIONING": Phase.STOPPING, "STOPPED": Phase.DEAD, "SUSPENDED": Phase.DEAD, "TERMINATED": Phase.DEAD,
    "REPAIRING": Phase.BOOTING,
}
TPU_PHASES = {
    "CREATING": Phase.BOOTING, "READY": Phase.RUNNING, "RESTARTING": Phase.BOOTING, "REIMAGING": Phase.BOOTING,
    "DELETING": Phase.DELETING, "REPAIRING": Phase.BOOTING, "STOPPED": Phase.DEAD, "STOPPING": Phase.STOPPING,
    "STARTING": Phase.BOOTING, "PREEMPTED": Phase.DEAD, "TERMINATED": Phase.DEAD, "HIDING": Phase.DEAD,
    "HIDDEN": Phase.DEAD, "UNHIDING": Phase.BOOTING, "UNKNOWN": Phase.UNKNOWN, "STATE_UNSPECIFIED": Phase.UNKNOWN,
}


def phase_of(kind: str, raw_state: str | None) -> Phase:
    """kind gpu|tpu, the API's state string (None: 404; a request's, while the node is obtained through one:
    models.Obtaining) → Phase."""
    if raw_state is None:
        return Phase.ABSENT
    request = models.request_way(raw_state).phase(raw_state)
    if request is not None:
        return Phase(request)
    table = TPU_PHASES if kind == "tpu" else GCE_PHASES
    return table.get(raw_state.upper(), Phase.UNKNOWN)


@dataclass(frozen=True)
class NodeObs:
    phase: Phase
    raw_state: str | None = None

    @property
    def present(self) -> bool:
        return self.phase is not Phase.ABSENT


ABSENT = NodeObs(Phase.ABSENT)


# The cause of a hint from a node agent's notice message (contract.notice_nudge): the node is about to go. A notice
# of its run's end (kind NOTICE_RUN_ENDING: a model whose runs end as planned) is its own cause: a planned stop,
# whatever the heartbeat says yet (the message may come before the agent's `preempting` beat).
NOTICE = "notice"
RUN_END_NOTICE = "notice:run-ending"
NOTICES = (NOTICE, RUN_END_NOTICE)


@dataclass(frozen=True)
class Hint:
    """What an event said about one node: `cause` (e.g. "preempted") for node `node`, at `at` (the entry's time)."""

    cause: str
    node: str
    at: datetime | None = None

    def about(self, node: str | None, started_at: datetime | None) -> str | None:
        """The cause, when the event is about `node`'s current life (not an older life that a restart replaced)."""
        if node != self.node or (self.at is not None and started_at is not None and self.at < started_at):
            return None
        return self.cause


@dataclass(frozen=True)
class Settings:
    stale_heartbeat_seconds: float = 120  # agents beat every 15 s
    boot_grace_seconds: float = 900  # first heartbeat may take this long after create (image boot, agent install)
    backoff_base_seconds: float = 30
    max_in_place_restarts: int = 1  # per node; then the node is replaced (a new name, maybe a new zone)
    # A multi-node generation whose step has not changed for this long while every member trains in it and beats is
    # stalled (a partition: job.stalled); 0 turns the rule off. Far above a beat (15 s) and a usual pause
    # between two steps (a checkpoint save, a trainer's start and restore), and below the trainers' collective
    # timeout (RESPAWN_COLLECTIVE_TIMEOUT_SECONDS, 300 s), so a cut-off member is replaced before the survivors'
    # collectives fail and restart the world with it. Raise both for longer pauses.
    progress_timeout_seconds: float = 240
    # A job with a budget stops when its cost would reach the cap within this long at its current burn: the sweep's
    # period (2 min) and a node's soft-off (30 s), so no node runs past the cap before the next look.
    budget_lookahead_seconds: float = 150
    timings: recovery.Timings = recovery.Timings()  # a fresh node against a restart in place, during a notice


@dataclass(frozen=True)
class Observation:
    job_id: str
    spec: JobSpec | None  # the user's, as the job document holds it
    spec_errors: tuple[str, ...]
    status: SlotStatus | JobStatus  # a member slot's (decide), the job's (functions/job.py)
    cancel_requested: bool
    node: NodeObs  # the API's view of status.node in status.zone
    heartbeat: Heartbeat | None  # nodes/{status.node}
    now: datetime
    hint: str | None = None  # the cause an event gave for the current node's current life (Hint.about)
    blocked: Mapping[str, datetime] = field(default_factory=dict)  # zone → cooldown end, for this accelerator
    # zone → capacity advice, read only for a job that asks (placement.rank: advice) when it may place a node
    advice: Mapping[str, ZoneAdvice] = field(default_factory=dict)
    settings: Settings = Settings()
    image: ImageCheck | None = None  # the boot image as checked on the job's first handling (GPU); None: not checked
    # A slot's next node takes the job-wide attempt counter's next number (functions/job.py passes it; every node
    # of a job has its own name). None: the slot's attempt + 1.
    next_attempt: int | None = None
    # node name → the end of its serial console, read only for a node that needs_console() says decide may declare
    # a boot failure of (None: the provider has no console for it, e.g. a Cloud TPU VM).
    consoles: Mapping[str, str | None] = field(default_factory=dict)
    # The job's node prices by provisioning model (functions/costs.py), read only when a life may open
    # (costs.needs_quote); None: not read.
    quote: Quote | None = None
    # The share of its budget the job has spent (functions/job.py, from its ledger); None without a budget. A tier
    # with while_budget_below is passed over past it (recovery.Strategy.tier).
    budget_used: float | None = None
    # The API's view of status.leaving (the node the slot replaced during its notice); None: not looked at.
    leaving: NodeObs | None = None
    # status.leaving's heartbeat (its final one tells how its emergency save ended); None: none, or not looked at.
    leaving_heartbeat: Heartbeat | None = None
    # The member slot decided: its zones and tiers (functions/job.py: membership.slot_of). None: a one-node job's
    # one slot, walking the job's zones.
    slot: membership.Slot | None = None


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


def needs_capacity(status: MemberStatus, node: NodeObs, hint: str | None = None) -> bool:
    """Whether decide() may consult the zone cooldowns (Observation.blocked) for a job in `status` whose node is
    `node` (`hint`: what an event said of it): only when it may place a node or weigh a restart in place. observe()
    skips those reads otherwise."""
    return (status.state in (State.PENDING, State.WAITING_FOR_CAPACITY, State.PREEMPTED, State.RESTARTING)
            or node.phase in (Phase.ABSENT, Phase.DEAD, Phase.STOPPING, Phase.DELETING) or hint in NOTICES)


def needs_console(status: MemberStatus, node: NodeObs, heartbeat: Heartbeat | None, settings: Settings,
                  now: datetime) -> bool:
    """Whether decide() may declare the current node a boot failure (it serves, past its boot grace, and its agent
    never reported), and so read its console (Observation.consoles): observe() reads it only then."""
    return (status.state is State.RUNNING and node.phase is Phase.RUNNING
            and current_heartbeat(heartbeat, status) is None
            and (_age(now, status.node_started_at) or 0) > settings.boot_grace_seconds)


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else (now - then).total_seconds()


def current_heartbeat(hb: Heartbeat | None, s: MemberStatus) -> Heartbeat | None:
    """`hb` when it is of the slot's current node's current life: same attempt, not older than the node's
    (re)start; else None."""
    if hb is None or hb.attempt != s.attempt:
        return None
    if s.node_started_at is not None and hb.heartbeat_at < s.node_started_at:
        return None
    return hb


def slice_heartbeat(workers: Sequence[Heartbeat | None]) -> Heartbeat | None:
    """One heartbeat for a node from its workers' (a multi-host TPU slice: one per worker VM, worker 0 first; a
    single host: one). The slice serves only while every worker beats, so a worker without a heartbeat makes the
    slice's None (decide: still booting, or after the boot grace no heartbeat) and the stalest worker's time is
    the slice's. A worker whose setup failed, or whose trainer crashed, speaks for the slice; the slice exited 0
    only when every worker did. Otherwise the first worker still working is the base, with the newest committed
    step, any worker's notice, and its first step once every worker reporting steps stepped."""
    if not workers or any(hb is None for hb in workers):
        return None
    hbs: list[Heartbeat] = list(workers)  # type: ignore[arg-type]
    if len(hbs) == 1:
        return hbs[0]
    for hb in hbs:
        if hb.state is NodeState.SETUP_FAILED and not noticed(hb):
            return hb
    for hb in hbs:
        if hb.state is NodeState.EXITED and hb.exit_code not in (None, 0) and not noticed(hb):
            return hb
    # The slice steps once every worker that reports steps has (a worker sharing its host's status file reports
    # none): its last such worker's first step (recovery_time), also when every worker has finished.
    reporting = [hb for hb in hbs if hb.step is not None]
    stepped = bool(reporting) and all(hb.first_step_at is not None and hb.first_step is not None for hb in reporting)
    first = {"first_step": min(hb.first_step for hb in reporting) if stepped else None,  # type: ignore[type-var]
             "first_step_at": max(hb.first_step_at for hb in reporting) if stepped else None}  # type: ignore[type-var]
    if all(hb.state is NodeState.EXITED and hb.exit_code == 0 for hb in hbs):
        return hbs[0].model_copy(update=first)
    base = next((hb for hb in hbs if hb.state is not NodeState.EXITED), hbs[0])
    committed = [hb.committed_step for hb in hbs if hb.committed_step is not None]
    seen = next((hb for hb in hbs if noticed(hb)), None)
    return base.model_copy(update={
        **first,
        "heartbeat_at": min(hb.heartbeat_at for hb in hbs),
        "committed_step": max(committed) if committed else None,
        "notice": seen.notice if seen is not None else base.notice,
        "state": NodeState.PREEMPTING if seen is not None and seen.state is NodeState.PREEMPTING else base.state,
        "emergency": _worst_save(hbs, base),
    })


# A slice's emergency save is committed only when every worker's is: the worst worker's outcome speaks for it.
_SAVE_WORST_FIRST = ("failed", "abandoned", "not-started", "saving")


def _worst_save(hbs: Sequence[Heartbeat], base: Heartbeat) -> dict[str, Any] | None:
    saves = [hb.emergency for hb in hbs if isinstance(hb.emergency, dict)]
    return next((e for state in _SAVE_WORST_FIRST for e in saves if e.get("state") == state), base.emergency)


def _upd(s: SlotStatus, now: datetime, **changes: Any) -> SlotStatus:
    return s.model_copy(update={**changes, "updated_at": now, "revision": s.revision + 1})


def _slot(o: Observation) -> membership.Slot:
    assert o.spec is not None
    return o.slot if o.slot is not None else membership.slot_of(o.spec, 0)


def _delete(o: Observation) -> Action:
    return Action(Act.DELETE, zone=o.status.zone, node=o.status.node, attempt=o.status.attempt)


def decide(o: Observation) -> Decision:
    """A member slot's decision. Its job is live: one that ended, is cancelled or has an invalid spec is decided
    for the whole job, before any slot (functions/job.py). A node replaced during its notice (status.leaving) is
    deleted, when the slot has nothing else to do, once its notice is over or the API shows it off (its save is
    over then, and a preempted TPU node holds quota until deleted): by this pass, never left to the orphan scan."""
    if o.spec is None or o.status.state.terminal or o.cancel_requested:
        raise ValueError(f"job {o.job_id} is {o.status.state.value}, cancelled or invalid: functions/job.py decides it")
    told = _saved(o)
    if told is not None:  # how the leaving node's save ended, on the loss record before anything reads it
        o = replace(o, status=o.status.model_copy(update={"emergency": told}))
    d = _decide(o)
    if told is not None:
        d = _told_late(o, d, told)
    gone = o.status.leaving
    off = o.leaving is not None and o.leaving.phase in (Phase.DEAD, Phase.ABSENT)
    if gone is None or (o.now < gone.until and not off) or d.action.kind not in (Act.NONE, Act.WAIT, Act.POLL):
        return d
    base = d.status if d.status is not None else o.status
    return Decision(Action(Act.DELETE, zone=gone.zone, node=gone.node, attempt=gone.attempt),
                    _upd(base, o.now, leaving=None), d.cause, d.alert, d.details)


def _saved(o: Observation) -> dict[str, Any] | None:
    """The emergency save's outcome a node replaced during its notice told in its final heartbeat, when the loss
    record does not hold it yet (the loss was committed at the notice, before the save ended); else None."""
    hb, gone = o.leaving_heartbeat, o.status.leaving
    if hb is None or gone is None or hb.attempt != gone.attempt or not isinstance(hb.emergency, dict):
        return None
    if hb.emergency.get("state") not in losswords.FINAL or hb.emergency == o.status.emergency:
        return None
    return dict(hb.emergency)


# The causes whose event is written whatever the state does (functions/job.event): a save outcome told late rides
# on theirs.
TOLD_CAUSES = ("generation", "trainer_crashed", "move", "recovered")
SAVE_OUTCOME = "save_outcome"  # the event (and alert) of an emergency save's outcome told after its loss was recorded


def _told_late(o: Observation, d: Decision, told: dict[str, Any]) -> Decision:
    """A leaving node's save outcome, told after its loss was recorded (o.status holds it now): on the record, and
    said once — in this decision's own event when it writes one (a state change, a recovery: its details carry it),
    else in an event and a Slack alert of its own (`save_outcome`)."""
    gone = o.status.leaving
    node = gone.node if gone is not None else o.status.node
    if d.status is not None and (d.status.state != o.status.state or d.cause in TOLD_CAUSES):
        return replace(d, details={"emergency": told, **d.details})
    where = {"node": node, "zone": gone.zone if gone is not None else o.status.zone,
             "attempt": gone.attempt if gone is not None else o.status.attempt}
    alert = d.alert or alerts.make(SAVE_OUTCOME, o.job_id, o.now, f"{node} said how its emergency save ended after "
                                   "its loss was recorded", **where, emergency=told, restarts=o.status.restarts)
    return Decision(d.action, d.status if d.status is not None else _upd(o.status, o.now), SAVE_OUTCOME, alert,
                    {**d.details, **where, "emergency": told, "told_late": True})


def _decide(o: Observation) -> Decision:
    s, now, spec = o.status, o.now, o.spec
    assert spec is not None
    state = s.state
    hb = current_heartbeat(o.heartbeat, o.status)
    if hb is not None and hb.state is NodeState.EXITED and hb.exit_code == 0:
        committed = hb.committed_step if hb.committed_step is not None else s.last_committed_step
        told, words = ended_recovery(s, [hb])
        st = _upd(s, now, state=State.SUCCEEDED, message="trainer exited 0" + words, exit_code=0, recovering=False,
                  **({"steps_lost": told["steps_lost"]} if "steps_lost" in told else {}))
        alert = alerts.make("succeeded", o.job_id, now, "trainer exited 0; node deleted" + words, zone=s.zone,
                            restarts=s.restarts, attempt=s.attempt, committed_step=committed, **told,
                            **(loss_words(s, "emergency") if told else {}))  # the save of the loss it tells
        return Decision(_delete(o) if o.node.present else NONE, st, "trainer_succeeded", alert, told)
    if hb is not None and hb.state is NodeState.SETUP_FAILED and not noticed(hb):
        return _setup_failed(o, s, hb)
    if o.hint in NOTICES:
        planned = o.hint == RUN_END_NOTICE
        early = _on_notice(o, spec, hb, planned)
        if early is not None:
            return early
        # No head start: the notice is a loss on its way, as an event says.
        o = replace(o, hint=RUN_ENDED if planned else "preempted")

    if state is State.PENDING:
        if o.image is not None and o.image.verdict is ImageVerdict.MISSING:
            return image_missing(o, s)
        return _provision(o, spec, s, cause="job_created")

    if state is State.WAITING_FOR_CAPACITY:
        if o.node.present:  # a leftover of the refused attempt: it must go before anything else counts
            return Decision(POLL if o.node.phase is Phase.DELETING else _delete(o))
        if s.next_attempt_at is not None and now < s.next_attempt_at:
            return Decision(Action(Act.WAIT, until=s.next_attempt_at))
        return _provision(o, spec, s, cause="capacity_retry")

    if state in (State.PREEMPTED, State.RESTARTING):
        # The lost node is being removed; the replacement is created only once the API says it is gone (and, after
        # a failure, once its backoff is over).
        if o.node.phase is Phase.ABSENT:
            if s.next_attempt_at is not None and now < s.next_attempt_at:
                return Decision(Action(Act.WAIT, until=s.next_attempt_at))
            return _provision(o, spec, s, cause="replacement")  # the loss's own event told its cause
        if o.node.phase in (Phase.DELETING,):
            return Decision(POLL)
        return Decision(_delete(o))

    phase = o.node.phase
    if state is State.PROVISIONING:
        if s.create_state == "failed" and phase is not Phase.ABSENT:
            # A leftover of the refused attempt (a request that was not served): gone before the next.
            return Decision(POLL if phase is Phase.DELETING else _delete(o))
        way = models.obtaining(spec)
        refused = way.refusal(spec, s, o.node.raw_state, now)
        if refused is not None:
            return _request_refused(o, s, refused, way)
        if phase is Phase.ABSENT:
            if s.create_state == "pending":
                # Committed but never confirmed: the create call may not have happened (a crash). Re-issue it:
                # same name, same zone, so a create that did happen answers 409 and is adopted.
                return Decision(Action(Act.CREATE, zone=s.zone, node=s.node, attempt=s.attempt, provisioning=s.provisioning))
            if s.create_state == "failed":
                if s.next_attempt_at is not None and now < s.next_attempt_at:
                    return Decision(Action(Act.WAIT, until=s.next_attempt_at))
                if spec.accelerator.kind == "tpu" and s.leaving is not None and now >= s.leaving.until:
                    # A preempted TPU node, and a request whose node was taken, hold quota until deleted: the leaving
                    # one goes first (decide() deletes it on NONE), then the create is asked again.
                    return Decision(NONE)
                return _provision(o, spec, s, cause="zone_refused")
            why = models.of(s.provisioning).unanswered(s, _slot(o).tier(s.provisioning))
            if why is not None:
                return _unanswered(o, spec, why)
            return _lose(o, spec, hb, o.hint or "node_gone")
        if phase is Phase.RUNNING:
            return _running(o, s, hb)
        if phase is Phase.DEAD:
            if s.create_state == "starting" and recovery.strategy_for(spec).restart_in_place:
                # A restart in place was recorded but not (yet) seen to take: another delivery may be starting it
                # right now. Starting again is idempotent; counting a new loss would delete the node being started.
                return Decision(Action(Act.START, zone=s.zone, node=s.node, attempt=s.attempt))
            return _lose(o, spec, hb, o.hint or _dead_cause(o))
        if phase is Phase.STOPPING and not _in_place_candidate(o, spec):
            return _lose(o, spec, hb, o.hint or _stopping_cause(o))
        return Decision(POLL)  # BOOTING, STOPPING (restart-in-place candidate), DELETING, UNKNOWN

    # RUNNING
    if phase is Phase.RUNNING and o.hint is not None:
        # The audit event is written as the loss begins; the API may still say RUNNING for a moment.
        return Decision(POLL)
    if phase is Phase.RUNNING:
        if hb is not None and hb.state is NodeState.EXITED and hb.exit_code not in (None, 0) and not noticed(hb):
            return _lose(o, spec, hb, "trainer_crashed")
        if hb is None:
            age = _age(now, s.node_started_at)
            if age is not None and age > o.settings.boot_grace_seconds:
                return _lose(o, spec, hb, "no_heartbeat")
            return Decision(NONE)
        if (now - hb.heartbeat_at).total_seconds() > o.settings.stale_heartbeat_seconds:
            return _lose(o, spec, hb, "stale_heartbeat")
        return _healthy(o, s, hb)
    if phase in (Phase.ABSENT, Phase.DEAD, Phase.STOPPING, Phase.DELETING) and run_ending(s, hb, now):
        return _lose(o, spec, hb, RUN_ENDED)
    if phase in (Phase.ABSENT, Phase.DEAD):
        return _lose(o, spec, hb, o.hint or ("node_gone" if phase is Phase.ABSENT else _dead_cause(o)))
    if phase is Phase.STOPPING and not _in_place_candidate(o, spec):
        return _lose(o, spec, hb, o.hint or _stopping_cause(o))
    return Decision(POLL)  # BOOTING (restarting), STOPPING before a restart in place, DELETING, UNKNOWN


def ended_recovery(s: MemberStatus, ranks: Sequence[Heartbeat | None]) -> tuple[dict[str, Any], str]:
    """What a job's end says of the recovery under way at it (its details and alert fields, and words for its
    message): a run that resumed after the loss, stepped and finished before a reconcile told its recovery is told
    now (recovery_time.told); a job whose every rank finished the run it was in when the loss came (survivors that
    never restarted) resumed nothing and lost nothing, and says so. ({}, "") when there is nothing to tell."""
    if not s.recovering or not ranks or any(hb is None or hb.started_at is None for hb in ranks):
        back = (recovery_time.measure(s.last_cause, s.preempted_at, s.last_step, ranks)  # type: ignore[arg-type]
                if s.recovering and ranks and None not in ranks else None)
        return (back.fields() if back is not None else {}), ""
    resumed = [recovery_time.resumed_run(hb, True, s.preempted_at) for hb in ranks]  # type: ignore[arg-type]
    if not any(resumed):
        return ({"steps_lost": 0},
                f"; the last loss ({s.last_cause or 'unknown'}) cost no steps: the run finished without resuming")
    if not all(resumed):
        return {}, ""
    back = recovery_time.measure(s.last_cause, s.preempted_at, s.last_step, ranks)  # type: ignore[arg-type]
    return (back.fields() if back is not None else {}), ""


def loss_words(s: MemberStatus, *keys: str) -> dict[str, Any]:
    """The loss record's words an alert carries (last_error, emergency), those it holds."""
    return {k: getattr(s, k) for k in keys if getattr(s, k) is not None}


def _on_notice(o: Observation, spec: JobSpec, hb: Heartbeat | None, planned: bool) -> Decision | None:
    """The node's agent saw a preemption (or terminating maintenance) notice: its VM goes at the end of the notice
    window. Create the replacement now, while the node saves its emergency checkpoint, unless restarting it in place
    once it stopped would serve sooner (recovery.fresh_beats_in_place), or the loss would not create a node at once
    (a backoff, a limit reached, no zone): then None, and the stop is handled as any preemption. The noticed node
    is recorded as `leaving`: the new one's agent waits for its final heartbeat before training (ATTR_HANDOVER).
    `planned`: the notice is of the run's end its model planned (RUN_END_NOTICE)."""
    s = o.status
    if (s.state not in (State.RUNNING, State.PROVISIONING) or o.node.phase not in (Phase.RUNNING, Phase.STOPPING)
            or s.leaving is not None):  # one node saving beside the slot's at a time
        return None
    window = spec.notice_seconds + SOFT_OFF_SECONDS
    if _in_place_candidate(o, spec) and not recovery.fresh_beats_in_place(window, o.settings.timings):
        return None
    assert s.node is not None and s.zone is not None
    leaving = Leaving(node=s.node, zone=s.zone, attempt=s.attempt, until=o.now + timedelta(seconds=window))
    d = _lose(o, spec, hb, RUN_ENDED if planned or run_ending(s, hb, o.now) else "preempted", leaving=leaving)
    if d.action.kind is not Act.CREATE:
        return None
    handover = Handover(leaving.node, leaving.until.isoformat())
    return Decision(replace(d.action, handover=handover), d.status, d.cause, d.alert,
                    {**d.details, "during_notice": True, "leaving": leaving.node})


def _setup_failed(o: Observation, s: SlotStatus, hb: Heartbeat) -> Decision:
    """A trainer.setup command failed on the node: the job's environment is wrong, and another node (or zone) runs
    the same command. Not a preemption and not a crash to restart: the job ends FAILED, naming the command and its
    last error; one failure (no restart)."""
    command = " ".join(hb.failed_command or ["?"])
    how = f"failed with exit code {hb.exit_code}" if hb.exit_code is not None else "failed"  # an agent step has none
    error = losswords.last_error(hb.output_tail)
    msg = f"setup command {how} on {s.node}: {command}" + (f" ({error})" if error else "")
    failures = s.failures + 1
    st = _upd(s, o.now, state=State.FAILED, message=msg[:2000], exit_code=hb.exit_code, recovering=False,
              failures=failures, last_cause="setup_failed", last_error=error, emergency=None)
    alert = alerts.make("failed", o.job_id, o.now, msg, restarts=s.restarts, attempt=s.attempt, cause="setup_failed",
                        failures=failures, preemptions=s.preemptions, exit_code=hb.exit_code,
                        output_tail=hb.output_tail, failed_command=hb.failed_command, last_error=error)
    details = {"failed_command": hb.failed_command, "exit_code": hb.exit_code, "output_tail": hb.output_tail,
               "last_error": error}
    return Decision(_delete(o) if o.node.present else NONE, st, "setup_failed", alert, details)


def noticed(hb: Heartbeat) -> bool:
    """The agent saw a preemption/maintenance notice: an exit now is the preemption, not a crash."""
    return hb.notice is not None or hb.state is NodeState.PREEMPTING


def _dead_cause(o: Observation) -> str:
    lost = models.request_way(o.node.raw_state).lost_cause(o.node.raw_state)
    if lost is not None:  # a request whose node was taken, or that failed
        return lost
    raw = (o.node.raw_state or "").upper()
    return "preempted" if raw == "PREEMPTED" else f"node_{raw.lower() or 'dead'}"


def _stopping_cause(o: Observation) -> str:
    """A request whose node is being taken (a preemption); else a node stopping."""
    return models.request_way(o.node.raw_state).lost_cause(o.node.raw_state) or "node_stopping"


def _request_refused(o: Observation, s: SlotStatus, why: str, way: models.Obtaining) -> Decision:
    """The zone did not serve the slot's request (it failed, or waited past the job's limit): a refusal of the
    zone, as a refused create is. The request is deleted (force: it may be provisioning), then the next zone, or the
    next tier after the tier's refusals, as placement decides (PROVISIONING with create_state failed). It would hold
    quota, and could still be filled after the job moved on (gcp-facts §19)."""
    st = _upd(s, o.now, create_state="failed", consecutive_failures=s.consecutive_failures + 1,
              tried_zones=[*s.tried_zones, s.zone], message=f"{why}; deleting it, then the next zone"[:1000])
    return Decision(_delete(o), st, way.refused_cause,
                    details={"zone": s.zone, "node": s.node, "request_state": way.request_state(o.node.raw_state)})


def _healthy(o: Observation, s: SlotStatus, hb: Heartbeat) -> Decision:
    """A healthy running node (its progress is the job's to record: functions/job.py's `progress`). A replacement
    training is the recovery, and Slack hears of it: never before, so a node that never reports, or whose setup
    then fails, is never called recovered. Training that advances ends a streak of failures (their backoff)."""
    changes: dict[str, Any] = {}
    if (s.failure_streak and hb.committed_step is not None
            and (s.last_committed_step is None or hb.committed_step > s.last_committed_step)):
        changes["failure_streak"] = 0
    if s.boot_failures:
        changes["boot_failures"] = 0
    alert = None
    back = (recovery_time.measure(s.last_cause, s.preempted_at, s.last_step, [hb])
            if s.recovering and hb.state is NodeState.TRAINING else None)
    if back is not None:  # every rank steps again: the recovery, measured once (recovery_time)
        changes.update(recovering=False, message=f"running on {s.node} in {s.zone}", steps_lost=back.steps_lost)
        stages = recovery_stages(s, hb, back.stepping_at)
        alert = alerts.make(
            "recovered", o.job_id, o.now, f"training again on {s.node} in {s.zone}"
            + (f"; {alerts.breakdown_text(s.last_cause, stages, back.seconds)}" if stages else ""), stages=stages,
            old_zone=s.preempted_zone, new_zone=s.zone, committed_step=back.resumed_from, restarts=s.restarts,
            failures=s.failures, preemptions=s.preemptions, attempt=s.attempt, cause=s.last_cause, **back.fields(),
            in_place=s.in_place_restarts > 0 and s.preempted_zone == s.zone, **loss_words(s, "last_error", "emergency"),
        )
    if not changes:
        return Decision(NONE)
    return Decision(NONE, _upd(s, o.now, **changes), "recovered" if alert else None, alert,
                    {**back.fields(), **loss_words(s, "emergency")} if back is not None else {})


def _running(o: Observation, s: SlotStatus, hb: Heartbeat | None) -> Decision:
    """The API says the node serves: the job runs. After a loss the recovery is told once it trains again
    (_healthy), not here: the node may never get that far. How the node was obtained and its model may say more
    (a life that counts from now, after a long wait for capacity; a run's planned end)."""
    message = (f"replacement {s.node} running in {s.zone}; waiting for its agent's first heartbeat" if s.recovering
               else f"running on {s.node} in {s.zone}")
    own = {**models.obtaining(o.spec).on_running(o.now),
           **models.of(s.provisioning).on_running(_slot(o).tier(s.provisioning), o.now)}
    st = _upd(s, o.now, state=State.RUNNING, create_state="created", consecutive_failures=0, tried_zones=[],
              next_attempt_at=None, message=message, running_at=o.now, **own)
    return Decision(NONE, st, "node_running")


def recovery_stages(s: SlotStatus, hb: Heartbeat, stepping_at: datetime) -> dict[str, float]:
    """Where a recovery's time went, in seconds, from its notice until every rank steps again (`stepping_at`:
    recovery_time.Recovery, so the stages add up to its time): stage → seconds, in order, for the stages whose ends
    are known (recovery_time.stages: every part named, so they sum to the figure). A restart in place has no create:
    its start is its 'VM create and boot'."""
    return recovery_time.stages(s.preempted_at, [("waiting_for_capacity", s.node_started_at),
                                                 ("vm_create_and_boot", s.running_at), ("setup", hb.started_at)],
                                stepping_at)


def run_ending(s: MemberStatus, hb: Heartbeat | None, now: datetime) -> bool:
    """The slot's node is at the planned end of its run (its model's: models.Model.run_end_near)."""
    return models.of(s.provisioning).run_end_near(s, hb, now)


def _unanswered(o: Observation, spec: JobSpec, msg: str) -> Decision:
    """A node gone before it ever ran, which its model reads as the zone's refusal (a request whose wait for
    capacity ran out: the platform deleted it): the next zone, or the next tier after the tier's refusals."""
    s = o.status
    refused = s.model_copy(update=dict(create_state="failed", consecutive_failures=s.consecutive_failures + 1,
                                       tried_zones=[*s.tried_zones, s.zone], message=msg))
    d = _provision(o, spec, refused, cause=models.of(s.provisioning).unanswered_cause)
    return Decision(d.action, d.status, d.cause, d.alert, {**d.details, "zone": s.zone, "node": s.node,
                                                           "refused": msg})


def _in_place_candidate(o: Observation, spec: JobSpec) -> bool:
    """The job's strategy restarts the stopped node where it stands (recovery.Strategy.in_place)."""
    return recovery.strategy_for(spec).in_place(o.status, o.blocked, o.now, o.settings.max_in_place_restarts)


# Why a node was lost → what it counts as. A failure is the job's own doing: its trainer crashed, or its agent
# stopped reporting while the VM ran (a hang, an agent killed) without having seen a notice. A boot failure: the
# node served past its boot grace and its agent never reported (a broken image, a failing startup script, an agent
# that cannot install). Every other cause is the platform taking the node: a preemption (preempted, host error,
# stopped, deleted or gone from outside, a notice seen by the agent).
FAILURE_CAUSES = recovery_time.FAILURES  # unreachable: job.UNREACHABLE
BOOT_FAILURE = recovery_time.NO_HEARTBEAT
BOOT_FAILURES_TO_FAIL = 2  # boots in a row whose agent never reported: the second ends the job
# A run that ended as its model planned (models.Model.loss_cause: its agent's notice of it, or a loss near the end):
# a planned stop (models.RUN_ENDED). The next node is made as after a loss, but it counts as neither a preemption
# nor a failure, and its zone is not avoided.
RUN_ENDED = models.RUN_ENDED
LossKind = Literal["preemption", "failure", "boot_failure", "planned"]


def loss_kind(cause: str, hb: Heartbeat | None) -> LossKind:
    if cause == BOOT_FAILURE:
        return "boot_failure"
    if cause == RUN_ENDED:
        return "planned"
    if cause in FAILURE_CAUSES and not (hb is not None and noticed(hb)):
        return "failure"
    return "preemption"


def _console(o: Observation, node: str | None) -> str:
    """The tail of the lost node's console as recorded: what observe() read, or why there is none."""
    if node is None or node not in o.consoles:
        return "(the console was not read)"
    tail = o.consoles[node]
    if tail is None:
        return ("(no console: the Cloud TPU API has no serial port output; "
                "`gcloud compute tpus tpu-vm ssh NODE --zone ZONE --command 'sudo journalctl -u google-startup-scripts'` "
                "while a node is up shows the startup script's log)")
    return tail[-CONSOLE_TAIL_CHARS:]


def boot_help(spec: JobSpec, node: str | None, grace: float) -> str:
    """What to check when no agent ever reported: named concretely for the job's kind of node."""
    if spec.accelerator.kind == "tpu":
        boots = f"the TPU runtime version ({spec.accelerator.runtime_version})"
    else:
        boots = f"the boot image ({spec.accelerator.boot_image}: it must have python3 3.9+ and curl or gsutil)"
    return (f"no agent heartbeat from {node} within {int(grace)} s of its boot, twice in a row: check {boots}; "
            "the startup script (metadata startup-script: its JSON lines in the console tail below name the step "
            "that failed); the agent's install (metadata respawn-agent names the release the node downloads: the "
            "node's service account must read it, and the node must reach storage.googleapis.com and "
            "firestore.googleapis.com)")


def _recent(s: SlotStatus, spec: JobSpec, now: datetime) -> list[datetime]:
    """The preemption times the rate needs, this one included, newest last."""
    times = [*s.preempted_times, now]
    rate = spec.preemption_rate
    if rate is not None:
        times = [t for t in times if t > now - timedelta(hours=rate.window_hours)]
    else:
        times = times[-1:]
    return times[-MAX_PREEMPTION_TIMES:]


def _backoff(spec: JobSpec, o: Observation, n: int) -> float:
    """The wait before the next node after the n-th failure in a row (or the n-th preemption over the rate)."""
    return min(float(spec.placement.max_backoff_seconds), o.settings.backoff_base_seconds * 2 ** min(max(n - 1, 0), 20))


def _lose(o: Observation, spec: JobSpec, hb: Heartbeat | None, cause: str, leaving: Leaving | None = None
          ) -> Decision:
    """_count_loss, its event naming the life that ended (`lost`: what the node's last heartbeat said of its trainer),
    so that a later report (respawn/app/report.py) knows every life, not only the last one a node's heartbeat keeps.
    The cause is first read by the node's model (a loss at the planned end of its run is that end, however it was
    observed), then told in the one vocabulary of causes (recovery_time.loss_cause: the same fault, the same cause;
    the signal it came by, when another word, in the event's `signal`)."""
    signal = models.of(o.status.provisioning).loss_cause(cause, o.status, hb, o.now)
    d = _count_loss(o, spec, hb, recovery_time.loss_cause(signal, hb is not None and noticed(hb)), leaving)
    after = d.status if d.status is not None else o.status
    return replace(d, details={**d.details, "lost": lost_life(o.status, hb),
                               **({"signal": signal} if signal != d.cause else {}),
                               **loss_words(after, "last_error", "emergency")})


def lost_life(s: MemberStatus, hb: Heartbeat | None) -> dict[str, Any]:
    """The lost node's trainer as its last heartbeat said (times as RFC 3339 text)."""
    life: dict[str, Any] = {"node": s.node}
    if hb is not None:
        for key in ("step", "committed_step", "first_step"):
            life[key] = getattr(hb, key)
        for key in ("started_at", "first_step_at", "heartbeat_at"):
            at = getattr(hb, key)
            life[key] = at.isoformat() if at is not None else None
    return life


def _count_loss(o: Observation, spec: JobSpec, hb: Heartbeat | None, cause: str, leaving: Leaving | None = None
          ) -> Decision:
    """The current node no longer serves. Count it as a preemption or a failure (or give up), then restart it in
    place, delete it, or — when it is already gone — provision the replacement (after a failure: once its backoff
    is over). `leaving`: the node is in its notice (_on_notice): provision the replacement beside it."""
    s, now = o.status, o.now
    kind = loss_kind(cause, hb)
    committed = s.last_committed_step
    last_step = s.last_step
    exit_code = s.exit_code
    if hb is not None:
        committed = hb.committed_step if hb.committed_step is not None else committed
        last_step = hb.step if hb.step is not None else last_step
        exit_code = hb.exit_code if hb.exit_code is not None else exit_code
    steps_lost = last_step - committed if last_step is not None and committed is not None else None
    if steps_lost is not None and steps_lost < 0:
        steps_lost = 0
    failed = kind in ("failure", "boot_failure")  # the job's own doing: RESTARTING, never PREEMPTED
    error = losswords.last_error(hb.output_tail) if failed and hb is not None else None
    counts: dict[str, Any] = {"restarts": s.restarts + 1}
    delay = 0.0
    if kind == "preemption":
        counts.update(preemptions=s.preemptions + 1, preempted_times=_recent(s, spec, now))
    elif kind != "planned":
        counts.update(failures=s.failures + 1, failure_streak=s.failure_streak + 1)
        delay = _backoff(spec, o, s.failure_streak + 1)
    if kind == "boot_failure":
        counts.update(boot_failures=s.boot_failures + 1, console_tail=_console(o, s.node))
    lost = dict(last_cause=cause, steps_lost=steps_lost, preempted_zone=s.zone, preempted_at=now, recovering=True,
                exit_code=exit_code, last_error=error, emergency=_emergency(hb, leaving), **counts)
    tallies = dict(restarts=counts["restarts"], failures=counts.get("failures", s.failures),
                   preemptions=counts.get("preemptions", s.preemptions), attempt=s.attempt, cause=cause,
                   **{k: v for k, v in (("last_error", error), ("emergency", lost["emergency"])) if v is not None})

    end = _give_up(o, spec, kind, cause, counts)
    if end is not None:
        msg, details = end
        msg += f"; last error: {error}" if error else ""
        st = _upd(s, now, state=State.FAILED, message=msg[:2000],
                  **{**lost, "restarts": s.restarts, "recovering": False})
        alert = alerts.make("failed", o.job_id, now, msg, **{**tallies, "restarts": s.restarts},
                            **_tail_fields(kind, hb, counts))
        return Decision(_delete(o) if o.node.present else NONE, st, cause, alert, details)

    alert = None
    if kind == "failure" and cause == "trainer_crashed":
        alert = alerts.make("crashed", o.job_id, now, f"trainer exited {exit_code} on {s.node}; restarting",
                            exit_code=exit_code, output_tail=(hb.output_tail if hb else None), **tallies)
    elif kind == "boot_failure":
        alert = alerts.make("boot_failed", o.job_id, now,
                            f"no agent heartbeat from {s.node} within {int(o.settings.boot_grace_seconds)} s of its "
                            f"boot; replacing it (a second such boot ends the job)",
                            console_tail=counts["console_tail"], zone=s.zone, node=s.node, **tallies)
    elif kind == "preemption" and spec.preemption_rate is not None:
        rate = spec.preemption_rate
        over = len(counts["preempted_times"]) - rate.max
        if over > 0:
            if rate.action == "backoff":
                delay = _backoff(spec, o, over)
            window = timedelta(hours=rate.window_hours)
            if s.rate_exceeded_at is None or now - s.rate_exceeded_at >= window:
                counts["rate_exceeded_at"] = lost["rate_exceeded_at"] = now
                what = (f"waiting {int(delay)} s before the next node" if rate.action == "backoff"
                        else "recovering as usual")
                alert = alerts.make("preemption_rate", o.job_id, now,
                                    f"{len(counts['preempted_times'])} preemptions within {rate.window_hours:g} h "
                                    f"(more than {rate.max}); {what}", window_hours=rate.window_hours,
                                    max=rate.max, action=rate.action, zone=s.zone, **tallies)
    until = now + timedelta(seconds=delay) if delay > 0 else None
    if until is not None:
        lost["next_attempt_at"] = until

    if until is None and o.node.phase is Phase.DEAD and _in_place_candidate(o, spec):
        st = _upd(s, now, state=State.PROVISIONING, message=f"restarting {s.node} in place in {s.zone}",
                  create_state="starting", node_started_at=now, in_place_restarts=s.in_place_restarts + 1, **lost)
        return Decision(Action(Act.START, zone=s.zone, node=s.node, attempt=s.attempt), st, cause, alert,
                        {"in_place": True})

    wait = f"; the next node after {until.isoformat()}" if until is not None else ""
    state = State.RESTARTING if failed else State.PREEMPTED
    what = _lost_words(s, cause, exit_code, error) if failed else f"{s.node} lost ({cause})"
    if leaving is not None and until is None:
        lost["leaving"] = leaving
    elif o.node.present:
        st = _upd(s, now, state=state, message=f"{what}; deleting it before the replacement{wait}"[:2000], **lost)
        return Decision(_delete(o), st, cause, alert, {"node_state": o.node.raw_state, "counted_as": kind})

    if until is not None:
        st = _upd(s, now, state=state, message=f"{what}{wait}"[:2000], **lost)
        return Decision(Action(Act.WAIT, until=until), st, cause, alert, {"counted_as": kind})
    base = s.model_copy(update=lost)
    d = _provision(o, spec, base, cause=cause)
    if alert is not None and d.alert is None:
        d = Decision(d.action, d.status, d.cause, alert, d.details)
    return d


def _lost_words(s: MemberStatus, cause: str, exit_code: int | None, error: str | None) -> str:
    """A failure as its status message says it: 'trainer exited 1 on job-3 (ValueError: bad learning rate)'."""
    if cause == "trainer_crashed":
        return f"trainer exited {exit_code} on {s.node}" + (f" ({error})" if error else "")
    return f"{s.node} failed ({cause}" + (f": {error})" if error else ")")


def _emergency(hb: Heartbeat | None, leaving: Leaving | None) -> dict[str, Any] | None:
    """A noticed node's emergency save as the loss records it: its heartbeat's word, once it is the last one (the
    node is gone, so nothing more will come) or the save is over. A node still in its notice (`leaving`) and still
    saving says it later, in its final heartbeat (decide._saved)."""
    if hb is None or not noticed(hb) or not isinstance(hb.emergency, dict):
        return None
    if leaving is not None and hb.emergency.get("state") not in losswords.FINAL:
        return None
    return dict(hb.emergency)


def counted(n: int, what: str) -> str:
    """'1 failure', '4 failures': a count as the messages say it."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def _tail_fields(kind: LossKind, hb: Heartbeat | None, counts: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "boot_failure":
        return {"console_tail": counts["console_tail"]}
    if hb is not None and hb.output_tail:
        return {"output_tail": hb.output_tail, "exit_code": hb.exit_code}
    return {}


def _give_up(o: Observation, spec: JobSpec, kind: LossKind, cause: str, counts: Mapping[str, Any]
             ) -> tuple[str, dict[str, Any]] | None:
    """The limit this loss goes past, as (the job's FAILED message, the event's details); None: recover."""
    s = o.status
    if kind == "boot_failure" and counts["boot_failures"] >= BOOT_FAILURES_TO_FAIL:
        return (boot_help(spec, s.node, o.settings.boot_grace_seconds),
                {"boot_failures": counts["boot_failures"], "console_tail": counts["console_tail"]})
    if kind in ("failure", "boot_failure") and counts["failures"] > spec.max_failures:
        # The count the status records (this failure included), so the message and `failures` say one number.
        return (f"gave up after {counted(counts['failures'], 'failure')}, more than max_failures "
                f"({spec.max_failures}) (last cause: {cause}); preemptions are not counted",
                {"max_failures": spec.max_failures})
    if kind == "preemption" and spec.max_preemptions is not None and counts["preemptions"] > spec.max_preemptions:
        return (f"gave up after {counted(counts['preemptions'], 'preemption')}, more than max_preemptions "
                f"({spec.max_preemptions}) (last cause: {cause})", {"max_preemptions": spec.max_preemptions})
    rate = spec.preemption_rate
    if kind == "preemption" and rate is not None and rate.action == "fail" and len(counts["preempted_times"]) > rate.max:
        return (f"{len(counts['preempted_times'])} preemptions within {rate.window_hours:g} h, more than "
                f"preemption_rate.max ({rate.max}); action fail", {"preemption_rate": rate.model_dump()})
    return None


def _provision(o: Observation, spec: JobSpec, s: SlotStatus, cause: str) -> Decision:
    """Choose a zone and commit the next attempt's node name before creating it; or wait when every zone refused."""
    now, slot = o.now, _slot(o)
    choice = recovery.strategy_for(spec, slot.tiers).choose(slot.zones, s, o.blocked, now, o.advice, o.budget_used)
    if choice.zone is None:
        failures = s.consecutive_failures + (1 if s.state is State.WAITING_FOR_CAPACITY else 0)
        waiting = s.model_copy(update={"consecutive_failures": failures})
        until = placement.backoff(spec, waiting, placement.cooldowns(o.blocked, choice.provisioning), now,
                                  o.settings.backoff_base_seconds, slot.zones)
        msg = f"every zone refused ({', '.join(slot.zones)}); next try at {until.isoformat()}"
        st = _upd(s, now, state=State.WAITING_FOR_CAPACITY, message=msg, next_attempt_at=until,
                  consecutive_failures=failures, tried_zones=[], create_state=None)
        alert = None
        if s.state is not State.WAITING_FOR_CAPACITY:  # alert on entering the wait, not on every retry
            alert = alerts.make("waiting_for_capacity", o.job_id, now, msg, next_attempt_at=until,
                                zones=list(slot.zones), restarts=s.restarts, attempt=s.attempt, cause=cause)
        return Decision(Action(Act.WAIT, until=until), st, "no_capacity", alert, {"skipped": list(choice.skipped)})
    attempt = o.next_attempt if o.next_attempt is not None else s.attempt + 1
    node = node_name(o.job_id, attempt)
    zones_used = s.zones_used if s.zones_used[-1:] == [choice.zone] else [*s.zones_used, choice.zone]
    st = _upd(s, now, state=State.PROVISIONING, attempt=attempt, node=node, zone=choice.zone,
              provisioning=choice.provisioning, create_state="pending", node_started_at=now, in_place_restarts=0,
              run_ends_at=None, running_at=None,
              zones_used=zones_used[-50:], next_attempt_at=None,
              message=f"creating {node} in {choice.zone} ({choice.provisioning}"
                      f"{': ' + choice.why if choice.why else ''})")
    details: dict[str, Any] = {"skipped": list(choice.skipped), "provisioning": choice.provisioning}
    if choice.why:
        details["tier_why"] = choice.why
    if choice.ranked:
        details["ranked_zones"] = list(choice.ranked)
    return Decision(Action(Act.CREATE, zone=choice.zone, node=node, attempt=attempt, provisioning=choice.provisioning),
                    st, cause, None, details)


# Outcomes of an action, recorded after it (pure as well). reconcile._act performs the call and classifies how it
# ended into an Outcome (placement.classify reads a raised exception); followup() says what that means before the job
# is read again, after_act() what to commit on the status read then. Neither reads anything but its arguments.

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
        return _upd(s, now, create_state="failed", next_attempt_at=s.leaving.until,
                    message=f"{zone} refused {s.node} while {s.leaving.node} still holds its quota: {message}"[:1000])
    return _upd(s, now, create_state="failed", consecutive_failures=s.consecutive_failures + 1,
                tried_zones=[*s.tried_zones, zone], message=f"{zone} refused {s.node} ({kind}): {message}"[:1000])


def after_start_refused(s: SlotStatus, attempt: int, zone: str, message: str, now: datetime) -> SlotStatus | None:
    """A restart in place was refused: the stopped node is deleted (PREEMPTED: the restart was already counted)
    and the replacement goes to another zone of the list."""
    if s.attempt != attempt or s.zone != zone or s.state is not State.PROVISIONING:
        return None
    return _upd(s, now, state=State.PREEMPTED, tried_zones=[*s.tried_zones, zone],
                consecutive_failures=s.consecutive_failures + 1,
                message=f"{zone} refused to restart {s.node} in place: {message}"[:1000])


def after_create_failed(job_id: str, s: SlotStatus, attempt: int, message: str, now: datetime) -> Decision | None:
    """A create failed for a reason no zone change fixes (bad machine type, permission): the job fails."""
    if s.attempt != attempt or s.state.terminal:
        return None
    msg = f"creating {s.node} in {s.zone} failed: {message}"[:1000]
    st = _upd(s, now, state=State.FAILED, message=msg, recovering=False)
    return Decision(NONE, st, "create_failed",
                    alerts.make("failed", job_id, now, msg, restarts=s.restarts, attempt=attempt, cause="create_failed"))


def after_created(s: SlotStatus, attempt: int, node: str, now: datetime) -> SlotStatus | None:
    """The create of `attempt` finished (or met 409 and adopted the node), or its restart in place did."""
    if s.attempt != attempt or s.node != node or s.create_state not in ("pending", "starting"):
        return None
    return _upd(s, now, create_state="created")


# The boot image (GPU VMs). reconcile.observe asks the provider once, when a job is first handled (PENDING): Compute
# Engine's images.getFromFamily for projects/P/global/images/family/F, images.get for projects/P/global/images/NAME.
# A missing image is a wrong spec, known before any node exists: INVALID. A check that could not be made (no
# permission on the image's project, a transient error) blocks nothing; if the create then meets the image's 404,
# after_act fails the job once (a 404 is never a zone's refusal), and create_error says how to find a valid image.
# What a look found and the help text are respawn.images' (the CLI looks too, before it registers a job).


def image_missing(o: Observation, s: SlotStatus) -> Decision:
    """The job's boot image does not exist (seen on its first handling, before any node): INVALID, naming it."""
    assert o.image is not None
    error = missing_error(o.image)
    msg = "invalid job spec: " + error
    st = _upd(s, o.now, state=State.INVALID, message=msg)
    alert = alerts.make("invalid_spec", o.job_id, o.now, msg, errors=[error], cause="image_not_found")
    return Decision(_delete(o) if o.node.present else NONE, st, "image_not_found", alert,
                    {"image": o.image.image, "answer": o.image.detail[:500]})


def create_error(out: Outcome) -> str:
    """The failure a create/start that no other zone can fix records; a 404 naming an image says how to find one."""
    m = IMAGE_MENTION.search(out.message) if out.kind is OutcomeKind.NOT_FOUND else None
    if m is None:
        return f"{out.code}: {out.message}"
    return f"{out.code}: {REQUEST_PREFIX.sub('', out.message)}. {image_help(m.group(0))}"
