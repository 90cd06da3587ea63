"""functions/job.py's stall rule, row by row (pure): a generation whose step stopped while every member
trains in it and beats (a network partition: the collective hangs, the heartbeats go on) is noticed after
Settings.progress_timeout_seconds, and the member cut off (told by who reaches the master) is replaced; with no
member to blame the generation restarts; either counts against the job's budget, so it cannot loop forever."""

from __future__ import annotations

from datetime import timedelta

import pytest

from respawn.control import job
from respawn.control.actions import Act
from respawn.control.observation import Settings
from respawn.control.job import MemberObs
from respawn.schema import State
from test_job_table import GEN1, NOW, RUNNING, SPARED, beat, member, observe, running_job

TIMEOUT = 60.0


def training(idle: float, reach: list[bool | None], generation: dict = GEN1, sent: int = 1):
    """A job of 3 training in `generation`, every member's step idle for `idle` s; reach[i]: member i's
    master_reachable."""
    status, _ = running_job(generation, sent=sent)
    seen = [MemberObs(RUNNING, beat(i + 1, "training", generation=generation["number"], step=40,
                                    step_idle_seconds=idle, master_reachable=reach[i]), f"10.0.0.{i + 1}")
            for i in range(3)]
    return status, seen


def decide(status, seen, timeout: float = TIMEOUT):
    return job.decide(observe(status, seen, settings=Settings(progress_timeout_seconds=timeout)), seen)


def test_a_generation_that_steps_or_pauses_less_than_the_timeout_is_left_alone():
    for idle in (0.0, TIMEOUT - 5):  # the beat is 2 s old: 57 s of the 60
        status, seen = training(idle, [None, True, True])
        d = decide(status, seen)
        assert d.action.kind is not Act.DELETE and d.cause != job.STALLED, idle
    status, seen = training(10 * TIMEOUT, [None, False, True])
    assert decide(status, seen, timeout=0).cause not in (job.STALLED, job.UNREACHABLE)  # 0: off


def test_the_member_that_cannot_reach_the_master_while_the_other_can_is_replaced_and_counted():
    status, seen = training(TIMEOUT, [None, True, False])
    d = decide(status, seen)
    assert d.cause == job.UNREACHABLE and d.details["cut_off"] == ["job-3"]
    assert (d.action.kind, d.action.node, d.action.slot) == (Act.DELETE, "job-3", 2)
    assert d.status.members[2].state is State.RESTARTING and d.status.members[:2] == status.members[:2]  # a failure
    assert d.status.restarts == status.restarts + 1  # against the job's budget
    # The next pass: the generation no longer serves in full, so the stall is not read again while job-3 goes: its
    # slot is refilled (after the failure's backoff, where the job has one), nobody else is touched.
    seen[2] = MemberObs()
    again = decide(d.status, seen)
    assert again.cause != job.UNREACHABLE and again.action.kind in (Act.WAIT, Act.CREATE)
    assert again.action.kind is Act.WAIT or again.action.slot == 2


def test_a_member_cut_off_is_deleted_before_a_warm_spare_joins_its_soft_off_saving_first():
    # The member cut off still runs, with no notice: no handover would wait for what it writes, so the spare does
    # not take its place in the pass that blames it (job._spare_first); its delete (the soft-off's save) comes first.
    status, seen = training(TIMEOUT, [None, True, False])
    status = status.model_copy(update={"members": [*status.members, member(3, 4)], "attempt": 4})
    seen = [*seen, MemberObs(RUNNING, beat(4), "10.0.0.4")]
    d = job.decide(observe(status, seen, spec=SPARED, settings=Settings(progress_timeout_seconds=TIMEOUT)), seen)
    assert d.cause == job.UNREACHABLE and (d.action.kind, d.action.node, d.action.slot) == (Act.DELETE, "job-3", 2)
    assert d.status.generation == GEN1


def test_a_master_no_member_reaches_is_the_one_replaced():
    status, seen = training(TIMEOUT + 1, [None, False, False])
    d = decide(status, seen)
    assert d.cause == job.UNREACHABLE and (d.action.kind, d.action.node, d.action.slot) == (Act.DELETE, "job-1", 0)


def test_two_nodes_blame_the_member_first_then_the_master_when_its_replacement_cannot_reach_it_either():
    gen = {"number": 1, "members": ["job-1", "job-2"], "master_addr": "10.0.0.1"}
    status, seen = training(TIMEOUT, [None, False, None], generation=gen)
    status = status.model_copy(update={"members": status.members[:2]})
    seen = seen[:2]
    spec = observe(status, seen).spec.model_copy(update={"nodes": 2})
    o = observe(status, seen, spec=spec, settings=Settings(progress_timeout_seconds=TIMEOUT))
    assert job.decide(o, seen).action.node == "job-2"
    replaced = status.members[1].model_copy(update={"last_cause": job.UNREACHABLE})
    status = status.model_copy(update={"members": [status.members[0], replaced]})
    o = observe(status, seen, spec=spec, settings=Settings(progress_timeout_seconds=TIMEOUT))
    assert job.decide(o, seen).action.node == "job-1"


def test_a_stall_no_member_is_blamed_for_restarts_the_generation_until_the_budget_is_spent():
    status, seen = training(TIMEOUT, [None, True, True])
    d = decide(status, seen)
    assert d.cause == job.STALLED and d.action.kind is Act.NONE
    assert d.status.generation == {**GEN1, "number": 2} and d.status.restarts == status.restarts + 1
    assert d.status.failures == status.failures + 1 and d.status.preemptions == status.preemptions
    assert d.alert is not None and "made no step" in d.alert["message"]
    preempted = status.model_copy(update={"restarts": 50, "preemptions": 50})  # preemptions never count
    assert decide(preempted, seen).status.state is State.RUNNING
    spent = status.model_copy(update={"failures": observe(status, seen).spec.max_failures})
    d = decide(spent, seen)
    assert d.status.state is State.FAILED and job.STALLED in d.status.message


@pytest.mark.parametrize("change", [
    {"state": "waiting"},  # between generations: nothing runs to stall
    {"generation": 0},  # still in an older generation (a restart under way)
    {"step_idle_seconds": None},  # an agent that does not say (an older agent)
])
def test_no_stall_is_read_unless_every_member_trains_in_the_generation_and_says_how_idle_it_is(change):
    status, seen = training(10 * TIMEOUT, [None, False, True])
    hb = seen[1].heartbeat.model_copy(update={k: (v if k != "state" else __import__("respawn.schema").schema.NodeState(v))
                                              for k, v in change.items()})
    seen[1] = MemberObs(RUNNING, hb, "10.0.0.2")
    d = decide(status, seen)
    assert d.cause not in (job.STALLED, job.UNREACHABLE), change


def test_the_age_of_the_beat_counts_towards_the_idle_time():
    status, seen = training(TIMEOUT - 30, [None, True, False])
    old = [MemberObs(RUNNING, s.heartbeat.model_copy(update={"heartbeat_at": NOW - timedelta(seconds=31)}), s.address)
           for s in seen]
    assert decide(status, old).cause == job.UNREACHABLE


def test_the_agents_step_clock_times_only_a_trainer_that_has_stepped():
    from node_agent.reach import StepClock, answers

    clock = StepClock()
    assert clock.idle(False, "t1", None) is None
    assert clock.idle(True, "t1", 40) is None  # a new trainer; 40 is what the status file showed before it
    assert clock.idle(True, "t1", 40) is None
    assert clock.first_step is None
    first = clock.idle(True, "t1", 41)
    assert first is not None and first < 1
    assert clock.first_step == 41 and clock.first_step_at is not None  # where this life's training began
    clock.idle(True, "t1", 45)
    assert clock.first_step == 41
    assert clock.idle(True, "t2", 41) is None  # the next trainer starts untimed
    assert clock.first_step is None
    # A closed port on this machine answers (refused): reachable. An address with no route does not.
    assert answers("127.0.0.1", 1, timeout=1)
