"""functions/job.py: the decisions for a job of several GPU VMs, row by row. Pure: an Observation and one
MemberObs per slot in, a Decision out (the entry-point tests are tests/test_functions_multinode.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from respawn.control import job
from respawn.control.actions import Act, Action
from respawn.control.observation import NodeObs, Observation, Phase
from respawn.control.outcomes import Outcome, OutcomeKind
from respawn.control.job import MemberObs
from respawn.contract import EXIT_PREEMPTED, Generation
from respawn.schema import Heartbeat, JobStatus, MemberStatus, NodeState, State, parse_spec

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)
ZONES = ["us-central1-a", "us-central1-b"]
SPEC = parse_spec({"id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": ZONES,
                   "trainer": {"command": ["python", "t.py"]}, "checkpoint_uri": "gs://bucket/job", "nodes": 3,
                   "on_demand_nodes": 1, "termination_action": "DELETE", "max_failures": 5})
RUNNING = NodeObs(Phase.RUNNING, "RUNNING")


def member(slot: int, attempt: int, **kw) -> MemberStatus:
    return MemberStatus(state=State.RUNNING, attempt=attempt, node=f"job-{attempt}", zone=ZONES[0],
                     provisioning="standard" if slot == 0 else "spot", create_state="created",
                     node_started_at=NOW - timedelta(minutes=5), address=f"10.0.0.{attempt}", **kw)


def beat(attempt: int, state: str = "waiting", **kw) -> Heartbeat:
    return Heartbeat(job_id="job", attempt=attempt, state=NodeState(state), heartbeat_at=NOW - timedelta(seconds=2),
                     **kw)


def observe(status: JobStatus, seen, spec=SPEC, **kw) -> Observation:
    return Observation(job_id="job", spec=spec, spec_errors=(), status=status, cancel_requested=False,
                       node=NodeObs(Phase.ABSENT), heartbeat=None, now=NOW, **kw)


def running_job(generation=None, sent=0) -> tuple[JobStatus, list[MemberObs]]:
    members = [member(i, i + 1, generation_sent=sent) for i in range(3)]
    status = JobStatus(state=State.RUNNING if generation else State.PROVISIONING, attempt=3, zone=ZONES[0],
                       node="job-1", members=members, generation=generation)
    seen = [MemberObs(RUNNING, beat(i + 1), f"10.0.0.{i + 1}") for i in range(3)]
    return status, seen


GEN1 = {"number": 1, "members": ["job-1", "job-2", "job-3"], "master_addr": "10.0.0.1"}


def test_a_pending_job_places_slot_0_first_with_the_first_attempt():
    d = job.decide(observe(JobStatus(), []), [])
    assert (d.action.kind, d.action.zone, d.action.node, d.action.slot, d.action.provisioning) == (
        Act.CREATE, ZONES[0], "job-1", 0, "standard")
    assert len(d.status.members) == 3 and d.status.zone == ZONES[0] and d.status.attempt == 1


def test_the_other_slots_follow_slot_0_into_its_zone_even_when_that_zone_cools_down():
    first = job.decide(observe(JobStatus(), []), []).status
    booting = [MemberObs(NodeObs(Phase.BOOTING, "STAGING"))]
    d = job.decide(observe(first, booting), booting)
    assert (d.action.kind, d.action.zone, d.action.node, d.action.slot) == (Act.CREATE, ZONES[0], "job-2", 1)
    # Zone a under a capacity cooldown: slot 1 waits for capacity there instead of going to zone b.
    cold = job.decide(observe(first, booting, blocked={ZONES[0]: NOW + timedelta(minutes=5)}), booting)
    assert cold.action.kind is Act.WAIT and cold.status.members[1].state is State.WAITING_FOR_CAPACITY
    assert all(m.zone in (None, ZONES[0]) for m in cold.status.members)


def test_every_slot_serving_forms_the_generation_with_the_on_demand_master():
    status, seen = running_job()
    d = job.decide(observe(status, seen), seen)
    assert d.action.kind is Act.NONE and d.cause == "generation"
    assert d.status.generation == GEN1 and d.status.state is State.RUNNING


def test_a_committed_generation_is_written_to_every_member_behind_in_one_action():
    status, seen = running_job(GEN1)
    status.members[1] = status.members[1].model_copy(update={"generation_sent": 1})
    d = job.decide(observe(status, seen), seen)
    assert d.action.kind is job.JobAct.SET_GENERATION
    assert d.action.targets == ((0, ZONES[0], "job-1"), (2, ZONES[0], "job-3"))
    after = job.after_act("job", status, d.action, Outcome(OutcomeKind.DONE), NOW)
    assert [m.generation_sent for m in after.status.members] == [1, 1, 1]


def test_a_lost_member_is_replaced_alone_in_the_jobs_zone_and_the_survivors_untouched():
    status, seen = running_job(GEN1, sent=1)
    seen[2] = MemberObs()  # job-3 is gone (404)
    d = job.decide(observe(status, seen), seen)
    assert (d.action.kind, d.action.zone, d.action.node, d.action.slot) == (Act.CREATE, ZONES[0], "job-4", 2)
    assert d.status.restarts == 1 and d.status.attempt == 4
    assert d.status.members[:2] == status.members[:2]
    assert d.status.generation == GEN1  # the survivors hold until the replacement serves


def test_a_refused_slot_with_too_few_survivors_moves_the_job_then_deletes_every_member():
    status, seen = running_job(GEN1, sent=1)
    status.members[2] = MemberStatus(state=State.WAITING_FOR_CAPACITY, attempt=4, node="job-4", zone=ZONES[0],
                                  next_attempt_at=NOW + timedelta(minutes=1))
    seen[2] = MemberObs()
    d = job.decide(observe(status, seen), seen)
    assert d.cause == "move" and d.status.moving and d.status.tried_zones == [ZONES[0]]
    assert d.status.recovering and d.status.preempted_at == NOW and d.status.preempted_zone == ZONES[0]
    moving = d.status
    d = job.decide(observe(moving, seen), seen)
    assert d.action == job.DeleteNodes(((0, ZONES[0], "job-1"), (1, ZONES[0], "job-2")))  # every member, this pass
    gone = [MemberObs()] * 3
    d = job.decide(observe(moving, gone), gone)
    assert not d.status.moving and d.status.zone is None and d.status.members[0].tried_zones == [ZONES[0]]
    d = job.decide(observe(d.status, gone), gone)
    assert (d.action.kind, d.action.zone) == (Act.CREATE, ZONES[1])  # slot 0 places the job outside zone a


def test_min_nodes_lets_the_survivors_continue_while_the_slot_is_refused():
    spec = parse_spec({**SPEC.to_doc(), "min_nodes": 2, "trainer": {"command": ["python", "t.py"]}})
    status, seen = running_job(GEN1, sent=1)
    status.members[2] = MemberStatus(state=State.WAITING_FOR_CAPACITY, attempt=4, node="job-4", zone=ZONES[0],
                                  next_attempt_at=NOW + timedelta(minutes=1))
    seen[2] = MemberObs()
    d = job.decide(observe(status, seen, spec=spec), seen)
    assert d.cause == "generation" and d.status.generation["members"] == ["job-1", "job-2"]
    assert d.status.generation["number"] == 2 and not d.status.moving


def test_a_finished_job_deletes_every_member_in_one_pass():
    status, seen = running_job(GEN1, sent=1)
    done = status.model_copy(update={"state": State.SUCCEEDED})
    assert job.decide(observe(done, seen), seen).action == job.DeleteNodes(
        ((0, ZONES[0], "job-1"), (1, ZONES[0], "job-2"), (2, ZONES[0], "job-3")))
    one = [MemberObs(), MemberObs(), seen[2]]  # the last one left: the slot's own delete
    assert job.decide(observe(done, one), one).action == Action(Act.DELETE, zone=ZONES[0], node="job-3", attempt=3,
                                                                slot=2)
    assert job.decide(observe(done, [MemberObs()] * 3), [MemberObs()] * 3).action.kind is Act.NONE


def training(i: int, generation: int = 1, **kw) -> MemberObs:
    return MemberObs(RUNNING, beat(i + 1, "training", generation=generation, **kw), f"10.0.0.{i + 1}")


SETTLED = timedelta(seconds=job.CRASH_SETTLE_SECONDS)


def test_one_members_crash_starts_the_next_generation_on_every_member_while_the_others_still_train():
    # job-3's trainer raised; job-1 and job-2 are blocked in the step's collective with it (they still say training).
    status, _ = running_job(GEN1, sent=1)
    seen = [training(0), training(1),
            MemberObs(RUNNING, beat(3, "waiting", generation=1, exit_code=1, output_tail="RuntimeError: boom"),
                      "10.0.0.3")]
    # First their exits are waited for, polled, for CRASH_SETTLE_SECONDS from when the crash was first seen.
    d = job.decide(observe(status, seen), seen)
    assert d.action.kind is Act.POLL and d.alert is None and d.status.crash_seen_at == NOW
    assert d.status.generation == GEN1 and d.status.failures == 0
    status = d.status
    d = job.decide(replace(observe(status, seen), now=NOW + SETTLED - timedelta(seconds=0.1)), seen)
    assert d.action.kind is Act.POLL and d.status is None
    # Still blocked when the time is up: every member restarts in the next generation.
    d = job.decide(replace(observe(status, seen), now=NOW + SETTLED), seen)
    assert d.cause == "trainer_crashed" and d.action.kind is Act.NONE and d.status.crash_seen_at is None
    assert d.status.generation == {**GEN1, "number": 2} and d.status.state is State.RUNNING
    assert (d.status.failures, d.status.restarts, d.status.preemptions) == (1, 1, 0)
    assert d.alert["type"] == "crashed" and d.alert["exit_code"] == 1 and d.alert["output_tail"] == "RuntimeError: boom"
    assert "job-3" in d.alert["message"] and "job-1" not in d.alert["message"]
    # The next pass writes generation 2 to every member at once: the survivors' agents stop their blocked trainers.
    d2 = job.decide(observe(d.status, seen), seen)
    assert d2.action.kind is job.JobAct.SET_GENERATION and d2.alert is None
    assert [t[2] for t in d2.action.targets] == ["job-1", "job-2", "job-3"]
    after = job.after_act("job", d.status, d2.action, Outcome(OutcomeKind.DONE), NOW).status
    # The survivors' trainers then fail in generation 1 too (their collective broke): one crash, counted once.
    failed = [MemberObs(RUNNING, beat(i + 1, "waiting", generation=1, exit_code=1), f"10.0.0.{i + 1}")
              for i in range(3)]
    d3 = job.decide(observe(after, failed), failed)
    assert d3.alert is None and (d3.status is None or (d3.status.failures, d3.status.generation["number"]) == (1, 2))


def test_the_member_that_raised_is_named_with_its_error_though_a_peer_whose_collective_broke_reported_first():
    # job-2's collective broke when job-3 raised, and job-2 reported first: the crash is seen, the others waited for.
    broke = ("[rank1]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.3]:5825\n"
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    raised = "[rank2]: ValueError: bad learning rate\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    status, _ = running_job(GEN1, sent=1)
    peer = MemberObs(RUNNING, beat(2, "waiting", generation=1, exit_code=1, output_tail=broke), "10.0.0.2")
    seen = [training(0), peer, training(2)]
    d = job.decide(observe(status, seen), seen)
    assert d.action.kind is Act.POLL and d.alert is None
    # 0.4 s later the member that raised reports, and job-1's collective broke too: every member has ended, so the
    # generation restarts at once, naming the one that raised first, with its own error.
    seen = [MemberObs(RUNNING, beat(1, "waiting", generation=1, exit_code=1, output_tail=broke), "10.0.0.1"), peer,
            MemberObs(RUNNING, beat(3, "waiting", generation=1, exit_code=1, output_tail=raised), "10.0.0.3")]
    d = job.decide(replace(observe(d.status, seen), now=NOW + timedelta(seconds=0.4)), seen)
    assert d.cause == "trainer_crashed" and d.status.generation == {**GEN1, "number": 2}
    assert d.alert["type"] == "crashed" and d.alert["exit_code"] == 1 and d.alert["output_tail"] == raised
    assert d.status.last_error == d.alert["last_error"] == "ValueError: bad learning rate"
    assert "trainer exited 1 on job-3, job-1, job-2" in d.alert["message"], d.alert["message"]
    assert (d.status.failures, d.status.restarts) == (1, 1)


def test_a_member_stopped_by_the_notice_or_done_waits_for_the_others():
    status, _ = running_job(GEN1, sent=1)
    for code in (EXIT_PREEMPTED, 0):
        seen = [training(0), training(1), MemberObs(RUNNING, beat(3, "waiting", generation=1, exit_code=code),
                                                    "10.0.0.3")]
        d = job.decide(observe(status, seen), seen)
        assert d.alert is None and (d.status is None or d.status.generation == GEN1), code


def test_a_crash_reported_in_an_older_generation_restarts_nothing():
    gen2 = {**GEN1, "number": 2}
    status, _ = running_job(gen2, sent=2)
    seen = [training(0, 2), training(1, 2), MemberObs(RUNNING, beat(3, "waiting", generation=1, exit_code=1),
                                                      "10.0.0.3")]
    d = job.decide(observe(status, seen), seen)
    assert d.alert is None and (d.status is None or d.status.generation == gen2)


TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
             '    raise ValueError("bad learning rate")\nValueError: bad learning rate\n')


def test_a_crash_past_max_failures_fails_the_job_and_preemptions_do_not_count():
    status, _ = running_job(GEN1, sent=1)
    seen = [training(0), training(1), MemberObs(RUNNING, beat(3, "waiting", generation=1, exit_code=1,
                                                              output_tail=TRACEBACK), "10.0.0.3")]
    status = status.model_copy(update={"crash_seen_at": NOW - SETTLED})  # the others were waited for
    preempted = status.model_copy(update={"restarts": 40, "preemptions": 40})
    d = job.decide(observe(preempted, seen), seen)
    assert d.status.state is State.RUNNING and d.alert["type"] == "crashed" and d.status.failures == 1
    # The trainer's error, in one line, on the record, the event's details and the alert.
    said = (d.status.last_error, d.details["last_error"], d.alert["last_error"])
    assert said == ("ValueError: bad learning rate",) * 3
    assert job.event(observe(preempted, seen), d).details["last_error"] == "ValueError: bad learning rate"
    spent = status.model_copy(update={"failures": SPEC.max_failures, "restarts": SPEC.max_failures})
    d = job.decide(observe(spent, seen), seen)
    assert d.status.state is State.FAILED and d.alert["type"] == "failed" and d.status.exit_code == 1
    # One number: the message counts the failures the record counts (this one included), past max_failures.
    assert d.status.failures == d.alert["failures"] == SPEC.max_failures + 1
    assert (f"gave up after {SPEC.max_failures + 1} failures, more than max_failures ({SPEC.max_failures})"
            in d.status.message and "job-3" in d.status.message)
    assert "ValueError: bad learning rate" in d.status.message and d.status.last_error == d.alert["last_error"]


def test_members_a_step_apart_record_the_jobs_progress_once_and_settle():
    # Each member's trainer reports its own step; one slot's record must not undo another's pass after pass.
    status, _ = running_job(GEN1, sent=1)
    seen = [training(0, step=70, committed_step=50, total_steps=120), training(1, step=70, total_steps=120),
            training(2, step=69, total_steps=120)]
    writes = []
    for _ in range(4):
        d = job.decide(observe(status, seen), seen)
        if d.status is None:
            break
        writes.append(d)
        status = d.status
    assert len(writes) == 1 and d.status is None
    assert (status.last_step, status.last_committed_step, status.total_steps) == (70, 50, 120)


def settle(status: JobStatus, seen: list[MemberObs], passes: int = 8, **kw):
    """Decide and record pass after pass (acting as if every action succeeded) until nothing changes; the alerts."""
    sent = []
    for _ in range(passes):
        d = job.decide(observe(status, seen, **kw), seen)
        if d.alert is not None:
            sent.append(d.alert)
        if d.action.kind is job.JobAct.SET_GENERATION:
            d = job.after_act("job", d.status or status, d.action, Outcome(OutcomeKind.DONE), NOW)
        if d.status is None:
            break
        status = d.status
    return status, sent


def test_a_member_lost_and_replaced_is_one_recovered_alert_once_the_new_generation_trains():
    status, seen = running_job(GEN1, sent=1)
    # The last beats said step 58, committed 50: 8 steps at risk when the loss is seen, none once the notice's
    # emergency save committed step 60 (a figure taken at the loss would say 8).
    status = status.model_copy(update={"last_step": 58, "last_committed_step": 50})
    seen[2] = MemberObs()  # job-3 is gone; its replacement job-4 is created
    lost, sent = settle(status, seen, passes=1)
    assert lost.recovering and lost.preempted_at == NOW and lost.members[2].node == "job-4" and sent == []
    # The survivors committed the emergency step 60 and wait; job-4 serves (its agent reports: no alert yet).
    # job-4 was created and runs (its slot still recovering: its agent's first beat is the slot's own "recovered").
    job4 = lost.members[2].model_copy(update={"state": State.RUNNING, "create_state": "created", "address": "10.0.0.4",
                                              "node_started_at": NOW - timedelta(minutes=1)})
    replaced = lost.model_copy(update={"members": [*lost.members[:2], job4]})
    waiting = [MemberObs(RUNNING, beat(1, "waiting", generation=1, step=60, committed_step=60), "10.0.0.1"),
               MemberObs(RUNNING, beat(2, "waiting", generation=1, step=60, committed_step=60), "10.0.0.2"),
               MemberObs(RUNNING, beat(4, "waiting"), "10.0.0.4")]
    formed, sent = settle(replaced, waiting)
    assert formed.generation["members"] == ["job-1", "job-2", "job-4"] and formed.recovering and sent == []
    assert formed.steps_lost == 0  # the new generation resumes from the emergency step: nothing lost
    # Every rank trains in generation 2, restored from step 60; two have stepped, the last not yet: no recovery.
    def trains(last: int) -> list[MemberObs]:
        return [MemberObs(RUNNING, beat(a, "training", generation=2, step=last if a == 4 else 61, committed_step=60,
                                        started_at=NOW,
                                        **({"first_step": 61, "first_step_at": NOW - timedelta(seconds=1)}
                                           if a != 4 or last > 60 else {})), f"10.0.0.{a}") for a in (1, 2, 4)]
    waiting_for_4, sent = settle(formed, trains(60))
    assert sent == [] and waiting_for_4.recovering
    done, sent = settle(waiting_for_4, trains(61))
    assert [a["type"] for a in sent] == ["recovered"] and not done.recovering
    a = sent[0]
    assert (a["steps_lost"], a["furthest_step"], a["resumed_from"], done.steps_lost) == (0, 60, 60, 0)
    assert a["recovery_seconds"] == 0.0 and "all 3 nodes" in a["message"]  # the test's clock stands still
    assert settle(done, trains(61))[1] == []  # told once


def test_a_slot_refused_in_the_jobs_zone_is_not_the_job_waiting_for_capacity():
    spec = parse_spec({**SPEC.to_doc(), "min_nodes": 2, "trainer": {"command": ["python", "t.py"]}})
    status, seen = running_job(GEN1, sent=1)
    status.members[2] = MemberStatus(state=State.PROVISIONING, attempt=4, node="job-4", zone=ZONES[0],
                                  create_state="failed", tried_zones=[ZONES[0]])
    seen[2] = MemberObs()
    d = job.decide(observe(status, seen, spec=spec, blocked={ZONES[0]: NOW + timedelta(minutes=5)}), seen)
    assert d.status.members[2].state is State.WAITING_FOR_CAPACITY and d.alert is None


def test_a_move_records_what_the_survivors_committed_before_their_nodes_go():
    status, seen = running_job(GEN1, sent=1)
    status.members[2] = MemberStatus(state=State.WAITING_FOR_CAPACITY, attempt=4, node="job-4", zone=ZONES[0],
                                  next_attempt_at=NOW + timedelta(minutes=1))
    seen[:2] = [MemberObs(RUNNING, beat(a, "waiting", generation=1, step=41, committed_step=41), f"10.0.0.{a}")
                for a in (1, 2)]
    seen[2] = MemberObs()
    d = job.decide(observe(status, seen), seen)
    assert d.cause == "move" and (d.status.last_step, d.status.last_committed_step) == (41, 41)


def test_writing_a_generation_is_the_jobs_own_action_with_its_own_outcomes():
    # Written: recorded on its members. A member gone meanwhile (404): nothing recorded, the next pass sees it gone.
    # Anything else (5xx, the network): retried by redelivery. outcomes.followup knows nothing of generations.
    write = job.SetGeneration(Generation(2, ("job-1", "job-2"), "10.0.0.1").to_json(), ((0, ZONES[0], "job-1"),))
    done, gone, flaky = (job.followup(SPEC, write, Outcome(k), NOW) for k in
                         (OutcomeKind.DONE, OutcomeKind.NOT_FOUND, OutcomeKind.TRANSIENT))
    assert (done.record, done.propagate) == (True, False)
    assert (gone.record, gone.propagate) == (False, False)
    assert (flaky.record, flaky.propagate) == (False, True)
    status, _ = running_job(GEN1, sent=1)
    after = job.after_act("job", status, write, Outcome(OutcomeKind.DONE), NOW).status
    assert [m.generation_sent for m in after.members] == [2, 1, 1]


# ---- warm spares (spec.spare_nodes): a fourth slot whose node waits, prepared, for a generation naming it -----------

SPARED = parse_spec({**SPEC.to_doc(), "spare_nodes": 1, "trainer": {"command": ["python", "t.py"]}})


def spared_job(generation=GEN1, sent=1) -> tuple[JobStatus, list[MemberObs]]:
    members = [member(i, i + 1, generation_sent=sent if i < 3 else 0) for i in range(4)]
    status = JobStatus(state=State.RUNNING, attempt=4, zone=ZONES[0], node="job-1", members=members,
                       generation=generation)
    seen = [*(training(i) for i in range(3)), MemberObs(RUNNING, beat(4), "10.0.0.4")]
    return status, seen


def test_a_spare_slot_is_created_with_the_others_and_named_by_no_generation():
    d = job.decide(observe(JobStatus(), [], spec=SPARED), [])
    assert len(d.status.members) == 4
    status, seen = spared_job(generation=None, sent=0)
    d = job.decide(observe(status, seen, spec=SPARED), seen)
    assert d.cause == "generation" and d.status.generation == GEN1  # slots 0-2: the spare waits
    d = job.decide(observe(d.status, seen, spec=SPARED), seen)
    assert [t[2] for t in d.action.targets] == ["job-1", "job-2", "job-3"]  # the spare is never written to


def _written(status: JobStatus, d) -> JobStatus:
    """The job's status once decision `d`'s SetGeneration was written (reconcile's after_act, DONE)."""
    assert d.action.kind is job.JobAct.SET_GENERATION
    return job.after_act("job", d.status, d.action, Outcome(OutcomeKind.DONE), NOW).status


def test_a_lost_member_is_replaced_by_the_ready_spare_in_the_pass_that_sees_the_loss_before_its_slots_create():
    status, seen = spared_job()
    seen[1] = MemberObs()  # job-2 is gone (404)
    d = job.decide(observe(status, seen, spec=SPARED), seen)
    # The pass that sees the loss: the spare job-4 takes job-2's place (the survivors keep their ranks), committed
    # with the loss and written to generation 2's members at once; nothing of job-2 is left to wait for.
    assert d.action.kind is job.JobAct.SET_GENERATION and d.details["then"] == "create"
    assert d.status.generation == {"number": 2, "members": ["job-1", "job-3", "job-4"], "master_addr": "10.0.0.1"}
    assert [t[2] for t in d.action.targets] == ["job-1", "job-3", "job-4"]
    assert d.status.recovering and d.status.preempted_at == NOW and d.status.restarts == 1
    assert d.status.state is State.RUNNING  # seen from outside, the job trains on
    # The slot's loss is committed with it: its replacement's name and attempt, once; the create is not asked yet.
    m1 = d.status.members[1]
    assert (m1.node, m1.attempt, m1.create_state, m1.state) == ("job-5", 5, "pending", State.PROVISIONING)
    assert d.status.attempt == 5
    written = _written(status, d)
    assert [m.generation_sent for m in written.members] == [2, 0, 2, 2]
    # The next pass creates the replacement: the same name and attempt, derived again from what was committed.
    d = job.decide(observe(written, seen, spec=SPARED), seen)
    assert (d.action.kind, d.action.node, d.action.attempt, d.action.slot) == (Act.CREATE, "job-5", 5, 1)
    assert d.status is None or d.status.attempt == 5
    created = job.after_act("job", written, d.action, Outcome(OutcomeKind.DONE), NOW).status
    booting = [seen[0], MemberObs(NodeObs(Phase.BOOTING, "STAGING")), *seen[2:]]
    d = job.decide(observe(created, booting, spec=SPARED), booting)
    assert d.action.kind is not Act.CREATE  # never a second create, nor a new attempt
    formed, _ = settle(created, booting, spec=SPARED)
    assert formed.attempt == 5 and formed.generation["number"] == 2
    # job-5 serves: it is the next spare, and generation 2 stays.
    job5 = formed.members[1].model_copy(update={"state": State.RUNNING, "create_state": "created",
                                               "address": "10.0.0.5"})
    ready = formed.model_copy(update={"members": [formed.members[0], job5, *formed.members[2:]]})
    now_serving = [training(0, 2), MemberObs(RUNNING, beat(5), "10.0.0.5"), training(2, 2), training(3, 2)]
    assert settle(ready, now_serving, spec=SPARED)[0].generation["number"] == 2


def test_a_member_in_its_notice_is_replaced_by_the_spare_in_that_pass_which_waits_for_its_emergency_save():
    status, seen = spared_job()
    noticed = [seen[0], MemberObs(RUNNING, beat(2, "preempting", generation=1, notice="preempted"), "10.0.0.2",
                                  hint="notice"), *seen[2:]]
    d = job.decide(observe(status, noticed, spec=SPARED), noticed)
    leaving = d.status.members[1].leaving
    assert leaving.node == "job-2" and d.status.members[1].node == "job-5"
    # The pass that sees the notice writes generation 2 with the spare in job-2's place and the handover of job-2's
    # save; the replacement job-5 is created by the next pass.
    assert d.action.kind is job.JobAct.SET_GENERATION and d.details["then"] == "create"
    assert d.status.generation["members"] == ["job-1", "job-3", "job-4"]
    assert d.status.generation["handover"] == [{"node": "job-2", "until": leaving.until.isoformat()}]
    g = job.Generation.from_json(d.action.value)
    assert g.number == 2 and g.handover[0].node == "job-2"
    # The next pass: slot 1's node (job-5) is not there yet, job-2 still saves beside it; the create names job-2
    # as the node it takes over from (ATTR_HANDOVER), as the first ask would have.
    written = _written(status, d)
    after = [seen[0], MemberObs(leaving=RUNNING, leaving_heartbeat=noticed[1].heartbeat), *seen[2:]]
    d = job.decide(observe(written, after, spec=SPARED), after)
    assert (d.action.kind, d.action.node, d.action.attempt, d.action.slot) == (Act.CREATE, "job-5", 5, 1)
    assert d.action.handover == job.Handover("job-2", leaving.until.isoformat())
    formed, _ = settle(job.after_act("job", written, d.action, Outcome(OutcomeKind.DONE), NOW).status,
                       [seen[0], MemberObs(NodeObs(Phase.BOOTING, "STAGING"), leaving=RUNNING), *seen[2:]],
                       spec=SPARED)
    assert formed.generation["number"] == 2 and formed.attempt == 5


def test_a_dead_member_is_replaced_by_the_spare_before_its_delete_and_the_delete_before_the_create():
    status, seen = spared_job()
    dead = [seen[0], MemberObs(NodeObs(Phase.DEAD, "TERMINATED"), beat(2, "training", generation=1), "10.0.0.2"),
            *seen[2:]]
    d = job.decide(observe(status, dead, spec=SPARED), dead)
    assert d.action.kind is job.JobAct.SET_GENERATION and d.details["then"] == "delete"
    assert d.status.generation["members"] == ["job-1", "job-3", "job-4"] and "handover" not in d.status.generation
    assert d.status.members[1].state is State.PREEMPTED and d.status.members[1].node == "job-2"
    written = _written(status, d)
    d = job.decide(observe(written, dead, spec=SPARED), dead)
    assert (d.action.kind, d.action.node, d.action.slot) == (Act.DELETE, "job-2", 1)
    gone = [seen[0], MemberObs(), *seen[2:]]
    d = job.decide(observe(written, gone, spec=SPARED), gone)
    assert (d.action.kind, d.action.node, d.action.attempt) == (Act.CREATE, "job-5", 5)
    assert d.status.generation["number"] == 2


def test_a_loss_with_no_spare_serving_creates_the_replacement_first_and_the_survivors_hold():
    status, seen = spared_job()
    seen[3] = MemberObs(NodeObs(Phase.BOOTING, "STAGING"))  # the spare still boots
    seen[1] = MemberObs()
    d = job.decide(observe(status, seen, spec=SPARED), seen)
    assert (d.action.kind, d.action.node, d.action.slot) == (Act.CREATE, "job-5", 1)
    assert d.status.generation == GEN1


def test_a_member_whose_heartbeat_says_notice_is_left_out_for_the_spare_with_a_handover_of_its_window():
    # No head start (the notice seen in its heartbeat alone): the member still runs, saving; the spare takes its place.
    status, seen = spared_job()
    noticed = [seen[0], MemberObs(RUNNING, beat(2, "preempting", generation=1, notice="preempted"), "10.0.0.2"),
               *seen[2:]]
    formed, _ = settle(status, noticed, spec=SPARED)
    assert formed.generation["members"] == ["job-1", "job-3", "job-4"]
    assert formed.generation["handover"] == [{"node": "job-2", "until": (NOW + timedelta(seconds=30)).isoformat()}]


def _finished_beat(i: int, started: datetime, first_step: int) -> MemberObs:
    """Member i's trainer exited 0 at step 100 of 100, in a run started at `started` that first stepped `first_step`."""
    return MemberObs(RUNNING, beat(i + 1, "exited", exit_code=0, generation=1, step=100, committed_step=100,
                                   total_steps=100, started_at=started, first_step=first_step,
                                   first_step_at=started + timedelta(seconds=5)), f"10.0.0.{i + 1}")


def test_survivors_that_finish_after_a_loss_without_resuming_lost_nothing_and_say_so():
    # The last preemption came at step 98 of 100; the survivors' run (resumed at 74, long before it) finished.
    loss = NOW - timedelta(seconds=30)
    status, _ = running_job(GEN1, sent=1)
    lost = status.model_copy(update={"recovering": True, "preempted_at": loss, "last_cause": "preempted",
                                     "last_step": 98, "last_committed_step": 90, "preemptions": 2, "restarts": 2})
    seen = [_finished_beat(i, loss - timedelta(minutes=3), 75) for i in range(3)]
    d = job.decide(observe(lost, seen), seen)
    assert d.status.state is State.SUCCEEDED and d.alert["type"] == "succeeded"
    assert (d.status.steps_lost, d.alert["steps_lost"], d.details["steps_lost"]) == (0, 0, 0)
    assert "recovery_seconds" not in d.alert and "recovery_seconds" not in d.details  # no recovery to tell
    assert "cost no steps: the run finished without resuming" in d.alert["message"]
    text = job.alerts.to_slack(d.alert)["text"]
    assert "steps lost: 0" in text and "recovery time" not in text
    # A generation that did resume after the loss tells its recovery at the end, as before.
    resumed = [_finished_beat(i, loss + timedelta(seconds=10), 91) for i in range(3)]
    d = job.decide(observe(lost, resumed), resumed)
    assert (d.alert["recovery_seconds"], d.alert["resumed_from"], d.alert["steps_lost"]) == (15.0, 90, 8)
