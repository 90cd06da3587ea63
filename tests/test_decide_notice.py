"""Acting on the notice (issue #25), in the pure core: a node agent's notice message (observation.NOTICE) makes the slot
create its replacement while the noticed node saves its emergency checkpoint, unless a restart in place would serve
sooner; the noticed node is recorded as `leaving` (never an orphan while it saves) and deleted once its notice is
over. No fakes: Observations in, Decisions out."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from respawn.contract import Handover
from respawn.control import job, orphans
from respawn.control import decide as core
from respawn.control import actions, observation
from respawn.control.actions import Act, Action
from respawn.control.outcomes import Outcome, OutcomeKind, after_act, followup
from respawn.control.recovery import Timings, fresh_beats_in_place
from respawn.schema import JobStatus, Leaving, MemberStatus, State
from test_decide_table import GPU_DELETE, GPU_STOP, NOW, RATE_BACKOFF, TPU, ZONES, hb, make_spec, obs

WINDOW = 30  # JobSpec.notice_seconds 0 + contract.SOFT_OFF_SECONDS


@pytest.mark.parametrize("window,timings,fresh", [
    (30, Timings(), False),  # the default notice: the stopped VM serves again at 30 + 60 s, a fresh one at 90 s
    (150, Timings(), True),  # a 120 s notice: the fresh one is up long before the old one has even stopped
    (30, Timings(fresh_node_seconds=80), True),  # e.g. setup from the environment cache
    (30, Timings(in_place_start_seconds=200), True),
    (0, Timings(fresh_node_seconds=1, in_place_start_seconds=1), False),  # a tie keeps the disk
])
def test_a_fresh_node_beats_a_restart_in_place_only_when_it_serves_sooner(window, timings, fresh):
    assert fresh_beats_in_place(window, timings) is fresh


def _notice(spec=GPU_DELETE, state="RUNNING", raw="RUNNING", **kw):
    return obs(state, raw=raw, spec=spec, hint=observation.NOTICE, **kw)


def test_a_notice_creates_the_replacement_beside_the_noticed_node_and_records_it_leaving():
    o = _notice()
    d = core.decide(o)
    until = NOW + timedelta(seconds=WINDOW)
    assert d.action == Action(Act.CREATE, zone=ZONES[1], node="job-4", attempt=4, provisioning="spot",
                              handover=Handover("job-3", until.isoformat()))
    st = d.status
    assert (st.state, st.node, st.zone, st.attempt) == (State.PROVISIONING, "job-4", ZONES[1], 4)
    assert st.leaving == Leaving(node="job-3", zone=ZONES[0], attempt=3, until=until)
    # Counted once, as the preemption it is: the audit event that follows names job-3, no longer the slot's node.
    assert (st.preemptions, st.restarts, st.last_cause, st.preempted_at, st.recovering) == (1, 2, "preempted", NOW,
                                                                                            True)
    assert d.cause == "preempted" and d.details["during_notice"] is True and d.details["leaving"] == "job-3"
    assert observation.Hint("preempted", "job-3").about(st.node, st.node_started_at) is None


def test_a_notice_while_the_api_already_says_stopping_still_gets_its_head_start():
    d = core.decide(_notice(raw="STOPPING"))
    assert d.action.kind is Act.CREATE and d.status.leaving.node == "job-3"


def test_with_the_default_notice_a_stop_spot_vm_waits_to_be_restarted_in_place():
    d = core.decide(_notice(spec=GPU_STOP))
    assert (d.action, d.status) == (actions.POLL, None)


def test_with_a_120_s_notice_a_fresh_node_beats_the_restart_in_place():
    spec = make_spec(notice_seconds=120)
    d = core.decide(_notice(spec=spec))
    until = NOW + timedelta(seconds=150)
    assert d.action.kind is Act.CREATE and d.status.leaving.until == until
    assert d.action.handover == Handover("job-3", until.isoformat())


def test_a_stop_spot_vm_restarted_in_place_before_is_replaced_at_its_notice():
    d = core.decide(_notice(spec=GPU_STOP, in_place_restarts=1))
    assert d.action.kind is Act.CREATE


def test_a_tpu_node_is_replaced_at_its_notice():
    d = core.decide(_notice(spec=TPU, raw="READY"))
    assert d.action.kind is Act.CREATE and d.status.leaving.node == "job-3"


@pytest.mark.parametrize("why,o", [
    ("every zone cooling down", _notice(blocked={z: NOW + timedelta(hours=1) for z in ZONES})),
    ("past max_preemptions: the stop ends the job, not the notice", _notice(spec=make_spec(
        termination_action="DELETE", max_preemptions=2), preemptions=2)),
    ("over the preemption rate, whose action is a backoff", _notice(spec=make_spec(
        termination_action="DELETE", preemption_rate=RATE_BACKOFF), preempted_times=[NOW - timedelta(minutes=m) for m in (9, 5)])),
    ("a node of the slot still saves", _notice(leaving=Leaving(node="job-2", zone=ZONES[0], attempt=2,
                                                               until=NOW + timedelta(seconds=5)))),
    ("the node is already gone: the usual replacement", _notice(raw=None)),
])
def test_no_head_start_where_the_loss_would_not_create_a_node_at_once(why, o):
    d = core.decide(o)
    assert d.action.handover is None, why
    assert not (d.status is not None and d.status.leaving is not None and d.status.leaving.node == "job-3"), why
    if o.node.present:
        assert d.action.kind in (Act.POLL, Act.NONE), why  # never a delete of a node saving in its notice


def test_the_leaving_node_is_deleted_once_its_notice_is_over_and_not_before():
    leaving = Leaving(node="job-3", zone=ZONES[0], attempt=3, until=NOW + timedelta(seconds=1))
    running = replace(obs("RUNNING", spec=GPU_DELETE, attempt=4, node="job-4", zone=ZONES[1], leaving=leaving),
                      heartbeat=hb(attempt=4, step=120, committed_step=100))
    early = core.decide(running)
    assert early.action.kind is Act.NONE and (early.status is None or early.status.leaving == leaving)
    later = replace(running, now=NOW + timedelta(seconds=2))
    d = core.decide(later)
    assert d.action == Action(Act.DELETE, zone=ZONES[0], node="job-3", attempt=3)
    assert d.status.leaving is None and d.status.node == "job-4"


def test_a_leaving_node_the_api_shows_off_is_deleted_by_the_pass_that_sees_it():
    """Issue #34: a one-node TPU job's node replaced during its notice stayed PREEMPTED (holding its quota) until the
    orphan scan deleted it. Once the API shows the leaving node off (its save is over, whatever its window says),
    the pass that sees it deletes it; while it runs it is left to save."""
    leaving = Leaving(node="job-3", zone=ZONES[0], attempt=3, until=NOW + timedelta(seconds=20))
    booting = obs("PROVISIONING", raw="CREATING", spec=TPU, heartbeat="none", attempt=4, node="job-4", zone=ZONES[1],
                  leaving=leaving, create_state="created")
    saving = core.decide(replace(booting, leaving=observation.NodeObs(observation.Phase.RUNNING, "READY")))
    assert saving.action.kind is Act.POLL and (saving.status is None or saving.status.leaving == leaving)
    for raw in ("PREEMPTED", None):
        d = core.decide(replace(booting, leaving=observation.NodeObs(observation.phase_of("tpu", raw), raw)))
        assert d.action == Action(Act.DELETE, zone=ZONES[0], node="job-3", attempt=3), raw
        assert d.status.leaving is None and d.status.node == "job-4"
    # Through the job: the slot's MemberObs carries what reconcile saw of its leaving node.
    status = JobStatus(state=State.PROVISIONING, attempt=4, node="job-4", zone=ZONES[1], members=[MemberStatus(**{k: getattr(booting.status, k) for k in MemberStatus.model_fields})])
    o = replace(booting, status=status)
    seen = job.MemberObs(booting.node, None, leaving=observation.NodeObs(observation.Phase.DEAD, "PREEMPTED"))
    d = job.decide(o, [seen])
    assert d.action == Action(Act.DELETE, zone=ZONES[0], node="job-3", attempt=3, slot=0)
    assert d.status.members[0].leaving is None


def test_an_early_create_refused_for_quota_waits_for_the_leaving_node_without_cooling_the_zone():
    d = core.decide(_notice())
    refused = Outcome(OutcomeKind.QUOTA, "QUOTA_EXCEEDED", "Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded")
    f = followup(GPU_DELETE, d.action, refused, NOW)
    assert f.record and f.capacity is None  # the leaving node's own quota: no cooldown for every job
    st = after_act("job", d.status, d.action, refused, NOW).status
    assert (st.create_state, st.next_attempt_at, st.tried_zones) == ("failed", d.status.leaving.until, [])
    waiting = replace(obs("PROVISIONING", raw=None, spec=GPU_DELETE), status=st)
    assert core.decide(waiting).action == Action(Act.WAIT, until=d.status.leaving.until)
    after = core.decide(replace(waiting, now=d.status.leaving.until + timedelta(seconds=1)))
    assert after.action.kind is Act.CREATE and after.action.zone == ZONES[1] and after.action.handover is None
    # A capacity refusal of the same create is the zone's, as always.
    assert followup(GPU_DELETE, d.action, Outcome(OutcomeKind.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED"),
                    NOW).capacity is not None


def test_a_member_slot_gets_its_head_start_in_the_jobs_zone():
    spec = make_spec(termination_action="DELETE", nodes=3)
    members = [MemberStatus(state=State.RUNNING, attempt=i + 1, node=f"job-{i + 1}", zone=ZONES[0], provisioning="spot",
                            create_state="created", node_started_at=NOW - timedelta(hours=1), address=f"10.0.0.{i}",
                            generation_sent=1) for i in range(3)]
    status = JobStatus(state=State.RUNNING, attempt=3, zone=ZONES[0], members=members, revision=5,
                       generation={"number": 1, "members": ["job-1", "job-2", "job-3"], "master_addr": "10.0.0.0"})
    o = replace(obs("RUNNING", spec=spec), status=status)
    seen = [job.MemberObs(observation.NodeObs(observation.Phase.RUNNING, "RUNNING"),
                          hb(attempt=i + 1, step=50, committed_step=40, generation=1), f"10.0.0.{i}",
                          observation.NOTICE if i == 1 else None) for i in range(3)]
    d = job.decide(o, seen)
    assert d.action.kind is Act.CREATE and d.action.slot == 1 and d.action.zone == ZONES[0]
    assert d.action.handover.node == "job-2" and d.action.node == "job-4"
    member = d.status.members[1]
    assert (member.node, member.leaving.node) == ("job-4", "job-2")


def test_a_finished_job_deletes_a_leaving_node_too_and_forgets_it():
    leaving = Leaving(node="job-3", zone=ZONES[0], attempt=3, until=NOW + timedelta(seconds=20))
    status = JobStatus(state=State.CANCELLED, attempt=4, members=[MemberStatus(
        state=State.CANCELLED, attempt=4, node="job-4", zone=ZONES[1], leaving=leaving)], revision=9)
    o = replace(obs("CANCELLED", spec=GPU_DELETE), status=status)
    d = job.decide(o, [job.MemberObs(observation.ABSENT)])
    assert d.action == Action(Act.DELETE, zone=ZONES[0], node="job-3", attempt=3, slot=0)
    assert d.status.members[0].leaving is None and d.status.state is State.CANCELLED
    again = replace(o, status=d.status)
    assert job.decide(again, [job.MemberObs(observation.ABSENT)]).action.kind is Act.NONE


def test_the_orphan_scan_leaves_a_node_saving_in_its_notice_alone():
    labels = {"respawn-job": "job", "respawn-attempt": "3"}
    seen = [orphans.Seen("gpu", ZONES[0], "job-3", labels)]
    member = {"node": "job-4", "zone": ZONES[1], "state": "PROVISIONING"}
    saving = {"state": "PROVISIONING", "members": [{**member, "leaving": {"node": "job-3", "zone": ZONES[0],
                                                                       "attempt": 3, "until": NOW.isoformat()}}]}
    assert orphans.orphans(seen, {"job": saving}) == []
    assert orphans.orphans(seen, {"job": {"state": "PROVISIONING", "members": [member]}}) == seen
