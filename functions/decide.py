"""The decision core: a pure function from what reconcile observed of one member slot (a one-node job has one;
functions/job.py calls it for each, with the user's spec and the slot as membership.slot_of makes it) to at most
one action plus the slot's status to record. The job's progress (last_step, last_committed_step, total_steps) is
read here, written by functions/job.py alone.

All recovery policy lives here and in the modules it calls: placement.py and recovery.py (where the next node goes),
losses.py (what a loss counts as, and when to give up), outcomes.py (what an action's outcome means: followup,
after_act; reconcile._act only performs the call, classifies how it ended and carries out the answer). What it reads
is observation.py's Observation; what it answers, actions.py's Decision.
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

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Sequence

from respawn import losswords
from respawn.contract import SOFT_OFF_SECONDS, Handover
from respawn.images import ImageVerdict, missing_error
from respawn.schema import Heartbeat, JobSpec, Leaving, MemberStatus, NodeState, SlotStatus, State, node_name

from . import alerts, losses, membership, models, placement, recovery, recovery_time
from .actions import NONE, POLL, Act, Action, Decision, upd
from .observation import (NOTICES, RUN_END_NOTICE, Observation, Phase, age_of, current_heartbeat,
                          noticed)


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
                    upd(base, o.now, leaving=None), d.cause, d.alert, d.details)


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
    alert = d.alert or alerts.told(SAVE_OUTCOME, o.job_id, o.now, **where, emergency=told, restarts=o.status.restarts)
    return Decision(d.action, d.status if d.status is not None else upd(o.status, o.now), SAVE_OUTCOME, alert,
                    {**d.details, **where, "emergency": told, "told_late": True})


def _decide(o: Observation) -> Decision:
    s, now, spec = o.status, o.now, o.spec
    assert spec is not None
    state = s.state
    hb = current_heartbeat(o.heartbeat, o.status)
    if hb is not None and hb.state is NodeState.EXITED and hb.exit_code == 0:
        committed = hb.committed_step if hb.committed_step is not None else s.last_committed_step
        told, words = ended_recovery(s, [hb])
        st = upd(s, now, state=State.SUCCEEDED, message="trainer exited 0" + words, exit_code=0, recovering=False,
                  **({"steps_lost": told["steps_lost"]} if "steps_lost" in told else {}))
        alert = alerts.told("succeeded", o.job_id, now, s=s, committed_step=committed, recovery=told, words=words)
        return Decision(_delete(o) if o.node.present else NONE, st, "trainer_succeeded", alert, told)
    if hb is not None and hb.state is NodeState.SETUP_FAILED and not noticed(hb):
        return _setup_failed(o, s, hb)
    if o.hint in NOTICES:
        planned = o.hint == RUN_END_NOTICE
        early = _on_notice(o, spec, hb, planned)
        if early is not None:
            return early
        # No head start: the notice is a loss on its way, as an event says.
        o = replace(o, hint=losses.RUN_ENDED if planned else "preempted")

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
                # same name, same zone, so a create that did happen answers 409 and is adopted. (Also the create a
                # job left to this pass while a warm spare took the lost member's place: job._spare_first.) A node
                # it replaces during its notice is named again (ATTR_HANDOVER), as at the first ask.
                gone = s.leaving
                handover = Handover(gone.node, gone.until.isoformat()) if gone is not None else None
                return Decision(Action(Act.CREATE, zone=s.zone, node=s.node, attempt=s.attempt,
                                       provisioning=s.provisioning, handover=handover))
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
            age = age_of(now, s.node_started_at)
            if age is not None and age > o.settings.boot_grace_seconds:
                return _lose(o, spec, hb, "no_heartbeat")
            return Decision(NONE)
        if (now - hb.heartbeat_at).total_seconds() > o.settings.stale_heartbeat_seconds:
            return _lose(o, spec, hb, "stale_heartbeat")
        return _healthy(o, s, hb)
    if phase in (Phase.ABSENT, Phase.DEAD, Phase.STOPPING, Phase.DELETING) and run_ending(s, hb, now):
        return _lose(o, spec, hb, losses.RUN_ENDED)
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
    d = _lose(o, spec, hb, losses.RUN_ENDED if planned or run_ending(s, hb, o.now) else "preempted", leaving=leaving)
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
    st = upd(s, o.now, state=State.FAILED, message=msg[:2000], exit_code=hb.exit_code, recovering=False,
              failures=failures, last_cause="setup_failed", last_error=error, emergency=None)
    alert = alerts.told("failed", o.job_id, o.now, said=msg, restarts=s.restarts, attempt=s.attempt,
                        cause="setup_failed", failures=failures, preemptions=s.preemptions, exit_code=hb.exit_code,
                        output_tail=hb.output_tail, failed_command=hb.failed_command, last_error=error)
    details = {"failed_command": hb.failed_command, "exit_code": hb.exit_code, "output_tail": hb.output_tail,
               "last_error": error}
    return Decision(_delete(o) if o.node.present else NONE, st, "setup_failed", alert, details)


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
    st = upd(s, o.now, create_state="failed", consecutive_failures=s.consecutive_failures + 1,
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
        alert = alerts.told("recovered", o.job_id, o.now, s=s, back=back,
                            stages=recovery_stages(s, hb, back.stepping_at))
    if not changes:
        return Decision(NONE)
    return Decision(NONE, upd(s, o.now, **changes), "recovered" if alert else None, alert,
                    {**back.fields(), **losses.loss_words(s, "emergency")} if back is not None else {})


def _running(o: Observation, s: SlotStatus, hb: Heartbeat | None) -> Decision:
    """The API says the node serves: the job runs. After a loss the recovery is told once it trains again
    (_healthy), not here: the node may never get that far. How the node was obtained and its model may say more
    (a life that counts from now, after a long wait for capacity; a run's planned end)."""
    message = (f"replacement {s.node} running in {s.zone}; waiting for its agent's first heartbeat" if s.recovering
               else f"running on {s.node} in {s.zone}")
    own = {**models.obtaining(o.spec).on_running(o.now),
           **models.of(s.provisioning).on_running(_slot(o).tier(s.provisioning), o.now)}
    st = upd(s, o.now, state=State.RUNNING, create_state="created", consecutive_failures=0, tried_zones=[],
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
    return replace(d, details={**d.details, "lost": losses.lost_life(o.status, hb),
                               **({"signal": signal} if signal != d.cause else {}),
                               **losses.loss_words(after, "last_error", "emergency")})


def _count_loss(o: Observation, spec: JobSpec, hb: Heartbeat | None, cause: str, leaving: Leaving | None = None
          ) -> Decision:
    """The current node no longer serves. Count it as a preemption or a failure (or give up), then restart it in
    place, delete it, or — when it is already gone — provision the replacement (after a failure: once its backoff
    is over). `leaving`: the node is in its notice (_on_notice): provision the replacement beside it."""
    s, now = o.status, o.now
    kind = losses.loss_kind(cause, hb)
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
        counts.update(preemptions=s.preemptions + 1, preempted_times=losses.recent(s, spec, now))
    elif kind != "planned":
        counts.update(failures=s.failures + 1, failure_streak=s.failure_streak + 1)
        delay = losses.backoff(spec, o, s.failure_streak + 1)
    if kind == "boot_failure":
        counts.update(boot_failures=s.boot_failures + 1, console_tail=losses.console(o, s.node))
    lost = dict(last_cause=cause, steps_lost=steps_lost, preempted_zone=s.zone, preempted_at=now, recovering=True,
                exit_code=exit_code, last_error=error, emergency=losses.emergency(hb, leaving), **counts)
    tallies = dict(restarts=counts["restarts"], failures=counts.get("failures", s.failures),
                   preemptions=counts.get("preemptions", s.preemptions), attempt=s.attempt, cause=cause,
                   **{k: v for k, v in (("last_error", error), ("emergency", lost["emergency"])) if v is not None})

    end = losses.give_up(o, spec, kind, cause, counts)
    if end is not None:
        msg, details = end
        msg += f"; last error: {error}" if error else ""
        st = upd(s, now, state=State.FAILED, message=msg[:2000],
                  **{**lost, "restarts": s.restarts, "recovering": False})
        alert = alerts.told("failed", o.job_id, now, said=msg, **{**tallies, "restarts": s.restarts},
                            **losses.tail_fields(kind, hb, counts))
        return Decision(_delete(o) if o.node.present else NONE, st, cause, alert, details)

    alert = None
    if kind == "failure" and cause == "trainer_crashed":
        alert = alerts.told("crashed", o.job_id, now, node=s.node, exit_code=exit_code,
                            output_tail=(hb.output_tail if hb else None), **tallies)
    elif kind == "boot_failure":
        alert = alerts.told("boot_failed", o.job_id, now, node=s.node, zone=s.zone, console_tail=counts["console_tail"],
                            boot_grace_seconds=o.settings.boot_grace_seconds, **tallies)
    elif kind == "preemption" and spec.preemption_rate is not None:
        rate = spec.preemption_rate
        over = len(counts["preempted_times"]) - rate.max
        if over > 0:
            if rate.action == "backoff":
                delay = losses.backoff(spec, o, over)
            window = timedelta(hours=rate.window_hours)
            if s.rate_exceeded_at is None or now - s.rate_exceeded_at >= window:
                counts["rate_exceeded_at"] = lost["rate_exceeded_at"] = now
                alert = alerts.told("preemption_rate", o.job_id, now, in_window=len(counts["preempted_times"]),
                                    delay=delay, window_hours=rate.window_hours, max=rate.max, action=rate.action,
                                    zone=s.zone, **tallies)
    until = now + timedelta(seconds=delay) if delay > 0 else None
    if until is not None:
        lost["next_attempt_at"] = until

    if until is None and o.node.phase is Phase.DEAD and _in_place_candidate(o, spec):
        st = upd(s, now, state=State.PROVISIONING, message=f"restarting {s.node} in place in {s.zone}",
                  create_state="starting", node_started_at=now, in_place_restarts=s.in_place_restarts + 1, **lost)
        return Decision(Action(Act.START, zone=s.zone, node=s.node, attempt=s.attempt), st, cause, alert,
                        {"in_place": True})

    wait = f"; the next node after {until.isoformat()}" if until is not None else ""
    state = State.RESTARTING if failed else State.PREEMPTED
    what = losses.lost_words(s, cause, exit_code, error) if failed else f"{s.node} lost ({cause})"
    if leaving is not None and until is None:
        lost["leaving"] = leaving
    elif o.node.present:
        st = upd(s, now, state=state, message=f"{what}; deleting it before the replacement{wait}"[:2000], **lost)
        return Decision(_delete(o), st, cause, alert, {"node_state": o.node.raw_state, "counted_as": kind})

    if until is not None:
        st = upd(s, now, state=state, message=f"{what}{wait}"[:2000], **lost)
        return Decision(Action(Act.WAIT, until=until), st, cause, alert, {"counted_as": kind})
    base = s.model_copy(update=lost)
    d = _provision(o, spec, base, cause=cause)
    if alert is not None and d.alert is None:
        d = Decision(d.action, d.status, d.cause, alert, d.details)
    return d


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
        st = upd(s, now, state=State.WAITING_FOR_CAPACITY, message=msg, next_attempt_at=until,
                  consecutive_failures=failures, tried_zones=[], create_state=None)
        alert = None
        if s.state is not State.WAITING_FOR_CAPACITY:  # alert on entering the wait, not on every retry
            alert = alerts.told("waiting_for_capacity", o.job_id, now, said=msg, next_attempt_at=until,
                                zones=list(slot.zones), restarts=s.restarts, attempt=s.attempt, cause=cause)
        return Decision(Action(Act.WAIT, until=until), st, "no_capacity", alert, {"skipped": list(choice.skipped)})
    attempt = o.next_attempt if o.next_attempt is not None else s.attempt + 1
    node = node_name(o.job_id, attempt)
    zones_used = s.zones_used if s.zones_used[-1:] == [choice.zone] else [*s.zones_used, choice.zone]
    st = upd(s, now, state=State.PROVISIONING, attempt=attempt, node=node, zone=choice.zone,
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


# The boot image (GPU VMs). reconcile.observe asks the provider once, when a job is first handled (PENDING): Compute
# Engine's images.getFromFamily for projects/P/global/images/family/F, images.get for projects/P/global/images/NAME.
# A missing image is a wrong spec, known before any node exists: INVALID. A check that could not be made (no
# permission on the image's project, a transient error) blocks nothing; if the create then meets the image's 404,
# outcomes.after_act fails the job once (a 404 is never a zone's refusal), and outcomes.create_error says how to find
# a valid image.
# What a look found and the help text are respawn.images' (the CLI looks too, before it registers a job).


def image_missing(o: Observation, s: SlotStatus) -> Decision:
    """The job's boot image does not exist (seen on its first handling, before any node): INVALID, naming it."""
    assert o.image is not None
    error = missing_error(o.image)
    msg = "invalid job spec: " + error
    st = upd(s, o.now, state=State.INVALID, message=msg)
    alert = alerts.told("invalid_spec", o.job_id, o.now, said=msg, errors=[error], cause="image_not_found")
    return Decision(_delete(o) if o.node.present else NONE, st, "image_not_found", alert,
                    {"image": o.image.image, "answer": o.image.detail[:500]})
