"""respawn.control.recovery_time: one recovery figure (notice → every rank stepping again; steps lost = the furthest
step before the resume minus the step the resumed run restored) and one vocabulary of loss causes. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from respawn.control import alerts, recovery_time
from respawn.control.observation import slice_heartbeat
from respawn.schema import Heartbeat, NodeState

NOTICE = datetime(2026, 11, 28, 4, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return NOTICE + timedelta(seconds=s)


def rank(first_at: float | None, step: int, committed: int | None, first: int | None = None, worker: int = 0,
         started: float = 5, beat: float = 40) -> Heartbeat:
    """A rank of the resumed run: its trainer started `started` s after the notice, restored `committed`."""
    stepped = first_at is not None
    return Heartbeat(job_id="j", attempt=2, worker=worker, state=NodeState.TRAINING, step=step, committed_step=committed,
                     started_at=at(started), first_step=(first if first is not None else (committed or 0) + 1)
                     if stepped else None, first_step_at=at(first_at) if stepped else None, heartbeat_at=at(beat))


@pytest.mark.parametrize("case,furthest,ranks,seconds,lost,resumed", [
    # One node: preempted at step 107 (the last beat seen), its emergency save committed 110; the replacement
    # restored 110 and first stepped 31.5 s after the notice. Nothing lost: the figure is taken after the commit.
    ("single node, emergency save", 107, [rank(31.5, 113, 110)], 31.5, 0, 110),
    # No emergency save (the notice came too late): the replacement restored the periodic step 100.
    ("single node, periodic checkpoint", 107, [rank(31.5, 113, 100)], 31.5, 7, 100),
    # A TPU slice of 2 workers: its heartbeat is its workers' (observation.slice_heartbeat), stepping once the last has.
    ("TPU slice, 2 workers", 60, [slice_heartbeat([rank(20, 62, 60), rank(24.26, 61, 60, worker=1)])], 24.3, 0, 60),
    # A multi-node job: every member of the new generation, the last member's first step is the job's.
    ("multi-node, 3 members", 58, [rank(12, 62, 60), rank(13, 61, 60), rank(19.96, 61, 60)], 20.0, 0, 60),
    # An elastic job that lost a member and trains on fewer: the survivors restored the periodic step 40.
    ("elastic member loss", 47, [rank(8, 44, 40), rank(9, 42, 40)], 9.0, 7, 40),
    # No notice (a hard kill): the controller's detection starts the clock; the periodic step 90 was restored, its
    # first step seen a few steps late (at 93).
    ("no notice (hard kill)", 95, [rank(3, 97, 90, first=93)], 3.0, 5, 90),
])
def test_a_recovery_from_its_notice_to_every_rank_stepping(case, furthest, ranks, seconds, lost, resumed):
    r = recovery_time.measure("preempted", NOTICE, furthest, ranks)
    assert r is not None, case
    assert (r.seconds, r.steps_lost, r.resumed_from) == (seconds, lost, resumed), case
    # What the alert and the event carry reads back as the same recovery, and is told as one line everywhere.
    assert recovery_time.read(r.fields()) == r
    assert recovery_time.line(r.fields()).startswith(f"recovered in {seconds:.1f} s (notice → every rank stepping), "
                                                     f"{lost} steps lost")


def test_a_slice_worker_that_reports_no_step_does_not_hold_it_up():
    # Two workers sharing one host's status file (the demo's sim): the second reports no step at all.
    silent = Heartbeat(job_id="j", attempt=2, worker=1, state=NodeState.TRAINING, heartbeat_at=at(40))
    r = recovery_time.measure("preempted", NOTICE, 60, [slice_heartbeat([rank(20, 62, 60), silent])])
    assert r is not None and r.seconds == 20.0


def test_the_agents_first_step_is_the_first_step_trained():
    from respawn.agent.reach import StepClock

    clock = StepClock()
    # The status file at the trainer's start (an earlier life's), its first write, the restore, then a step.
    for step, committed in ((93, 93), (0, None), (60, 60)):
        clock.idle(True, "life-2", step, committed)
        assert clock.first_step is None, (step, committed)
    clock.idle(True, "life-2", 61, 60)
    assert clock.first_step == 61 and clock.first_step_at is not None
    fresh = StepClock()  # a run with no checkpoint: its step 1 is its first
    fresh.idle(True, "life-1", 0, None)
    fresh.idle(True, "life-1", 1, None)
    assert fresh.first_step == 1


def test_a_resumed_run_that_ends_between_two_beats_has_stepped_by_its_own_record():
    from respawn.agent.reach import StepClock, own_first_step

    started = at(5)
    mine = {"step": 120, "committed_step": 120, "first_step": 91, "first_step_at": at(12).timestamp()}
    assert own_first_step(mine, started) == (91, at(12))
    assert own_first_step({**mine, "first_step_at": at(4).timestamp()}, started) is None  # an earlier life's
    assert own_first_step({"step": 3}, started) is None  # a trainer that does not record it
    clock = StepClock()
    clock.idle(True, "life-2", 90, 90)  # the one beat of the run: its restore
    clock.idle(False, "life-2", 120, 120, own_first_step(mine, started))  # the next beat: it has exited 0
    assert (clock.first_step, clock.first_step_at) == (91, at(12))
    late = StepClock()  # a beat that saw step 97 first: the trainer's own record is exact, and wins
    late.idle(True, "life-2", 90, 90)
    late.idle(True, "life-2", 97, 90)
    late.idle(True, "life-2", 99, 90, own_first_step(mine, started))
    assert (late.first_step, late.first_step_at) == (91, at(12))


def test_the_controller_is_woken_at_a_first_step_seen_while_the_trainer_runs_only():
    # Seen only once the trainer ended, the first step wakes no one: the end itself wakes the controller, once.
    from respawn.agent.reach import Progress

    woken: list[str] = []
    mine = {"step": 10, "committed_step": 10, "first_step": 1, "first_step_at": at(6).timestamp()}
    ended = Progress(lambda: woken.append("ended"))
    assert ended.beat(False, "life-1", mine, at(5))["first_step_at"] == at(6) and woken == []
    running = Progress(lambda: woken.append("running"))
    running.beat(True, "life-1", {**mine, "step": 3, "committed_step": None}, at(5))
    running.beat(True, "life-1", {**mine, "step": 4, "committed_step": None}, at(5))
    assert woken == ["running"]


def test_a_slice_whose_workers_all_finished_steps_at_its_last_workers_first_step():
    done = [rank(20, 120, 120, first=61).model_copy(update={"state": NodeState.EXITED, "exit_code": 0}),
            rank(24, 120, 120, first=61, worker=1).model_copy(update={"state": NodeState.EXITED, "exit_code": 0})]
    hb = slice_heartbeat(done)
    assert hb is not None and hb.state is NodeState.EXITED and hb.first_step_at == at(24)


def test_no_recovery_until_every_rank_has_stepped():
    assert recovery_time.measure("preempted", NOTICE, 58, [rank(12, 62, 60), rank(None, 60, 60)]) is None
    assert recovery_time.measure("preempted", NOTICE, 58, [slice_heartbeat([rank(20, 62, 60),
                                                                            rank(None, 60, 60, worker=1)])]) is None
    assert recovery_time.measure("preempted", NOTICE, 58, [rank(None, 60, 60)]) is None  # restored, no step yet
    assert recovery_time.measure("preempted", None, 58, [rank(12, 62, 60)]) is None
    assert recovery_time.read({"recovery_seconds": 5}) is None  # an older event: no figure to read back


def test_only_a_run_begun_after_the_notice_is_the_resumed_one():
    assert recovery_time.resumed_run(rank(12, 62, 60, started=5), True, NOTICE)
    assert not recovery_time.resumed_run(rank(12, 62, 60, started=-5), True, NOTICE)  # a survivor's own run
    assert not recovery_time.resumed_run(rank(12, 62, 60, started=5), False, NOTICE)


@pytest.mark.parametrize("signal,noticed,cause", [
    # The platform taking a node, however Respawn heard of it: the audit log, a poll's state, the agent's notice.
    ("preempted", False, "preempted"), ("node_terminated", False, "preempted"), ("tpu_terminated", False, "preempted"),
    ("node_stopping", False, "preempted"), ("node_gone", False, "preempted"), ("host_error", False, "preempted"),
    ("stale_heartbeat", True, "preempted"), ("trainer_crashed", True, "preempted"),
    # The job's own faults, a planned stop and a failed request keep their names.
    ("stale_heartbeat", False, "stale_heartbeat"), ("trainer_crashed", False, "trainer_crashed"),
    ("no_heartbeat", False, "no_heartbeat"), ("run_ended", False, "run_ended"),
    ("queued_resource_failed", False, "queued_resource_failed"),
])
def test_the_same_fault_gives_the_same_cause(signal, noticed, cause):
    assert recovery_time.loss_cause(signal, noticed) == cause


def test_a_run_that_finished_before_its_recovery_was_told_tells_it_at_its_end():
    from dataclasses import replace

    from respawn.control import decide
    from test_decide_table import NOW, hb, obs

    lost = NOW - timedelta(seconds=30)
    done = hb("exited", exit_code=0, step=120, committed_step=120, started_at=lost + timedelta(seconds=5),
              first_step=101, first_step_at=lost + timedelta(seconds=12))
    d = decide.decide(replace(obs("RUNNING", recovering=True, preempted_at=lost, last_step=103,
                                  last_cause="preempted"), heartbeat=done))
    assert d.cause == "trainer_succeeded" and recovery_time.told(d.cause, d.details)
    assert (d.details["recovery_seconds"], d.details["steps_lost"]) == (12.0, 3)  # resumed from the commit at 100
    text = alerts.to_slack(d.alert)["text"]
    assert "recovery time: 12.0 s" in text and "steps lost: 3" in text


def test_slack_shows_the_figure_itself():
    r = recovery_time.measure("preempted", NOTICE, 107, [rank(31.46, 113, 100)])
    assert r is not None
    text = alerts.to_slack(alerts.make("recovered", "j", at(40), "training again", cause=r.cause, **r.fields()))["text"]
    assert "recovery time: 31.5 s" in text and "steps lost: 7" in text and "cause: preempted" in text


def test_a_breakdown_names_every_part_so_it_adds_up_to_the_recovery_time():
    # Slack said "this preemption cost 9.2 s: 1.0 s agent and setup, 7.0 s trainer start…" (8.0 s): parts under a
    # second were dropped. Every part is kept, each end rounded on the clock from the notice before subtracting.
    ends = [("waiting_for_capacity", at(0.44)), ("vm_create_and_boot", at(0.93)), ("setup", at(2.16))]
    parts = recovery_time.stages(NOTICE, ends, at(9.21))
    assert parts == {"waiting_for_capacity": 0.4, "vm_create_and_boot": 0.5, "setup": 1.3,
                     "restore_and_first_step": 7.0}
    seconds = recovery_time.Recovery("preempted", NOTICE, at(9.21), 10, 10).seconds
    assert seconds == 9.2 and round(sum(parts.values()), 1) == seconds
    assert recovery_time.breakdown("preempted", parts, seconds) == (
        "this preemption cost 9.2 s: 0.4 s waiting for capacity, 0.5 s VM create and boot, 1.3 s agent and setup, "
        "7.0 s trainer start, restore and first step")
    # An end unknown, or before the notice (a node created long before it), folds its time into the next part.
    parts = recovery_time.stages(NOTICE, [("waiting_for_capacity", at(-3600)), ("vm_create_and_boot", None),
                                          ("setup", at(20))], at(30))
    assert parts == {"setup": 20.0, "restore_and_first_step": 10.0}
    assert recovery_time.stages(None, ends, at(9)) == {}
    assert recovery_time.breakdown("run_ended", {"setup": 0.0, "restore_and_first_step": 0.4}, 0.4) == (
        "this planned stop cost 0.4 s: 0.4 s trainer start, restore and first step")
