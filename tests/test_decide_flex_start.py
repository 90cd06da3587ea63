"""Provisioning tiers with flex-start (issue #26 item 1), in the pure core: the next node's tier and why, a
flex-start request that waits (PENDING) and one whose wait ran out (a refusal, not a preemption), the run's end as a
planned stop (neither a preemption nor a failure; the next node starts over from the first tier). No fakes:
Observations in, Decisions out."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from respawn.control import decide as core
from respawn.control import actions, losses, observation
from respawn.control.actions import Act
from respawn.control.observation import NodeObs, Phase
from respawn.schema import State
from test_decide_table import NOW, ZONES, decide_job, hb, make_spec, obs

TIERED = make_spec(termination_action="DELETE",
                   provisioning=[{"model": "spot", "after_refusals": 2},
                                 {"model": "flex-start", "max_run_hours": 24, "wait_minutes": 20}, "standard"])
FLEX = dict(spec=TIERED, provisioning="flex-start")


def test_spot_refused_in_a_row_moves_the_next_node_to_flex_start_and_says_why():
    # Zones a and b refused Spot: the second refusal in a row moves on, and flex-start starts its own round at a.
    d = core.decide(obs("PROVISIONING", raw=None, heartbeat="none", spec=TIERED, create_state="failed",
                        consecutive_failures=2, tried_zones=ZONES[:2]))
    assert (d.action.kind, d.action.provisioning, d.action.zone) == (Act.CREATE, "flex-start", ZONES[0])
    assert d.status.message.endswith("(flex-start: spot: refused 2 times in a row)")
    assert d.details["provisioning"] == "flex-start" and d.details["tier_why"] == "spot: refused 2 times in a row"


def test_a_flex_start_request_waiting_for_capacity_is_polled_not_judged():
    d = core.decide(obs("PROVISIONING", raw="PENDING", heartbeat="none", node_started_at=NOW - timedelta(hours=1),
                        **FLEX))
    assert d.action == actions.POLL and d.status is None


def test_a_flex_start_request_whose_wait_ran_out_is_a_refusal_and_the_next_zone_is_tried():
    d = core.decide(obs("PROVISIONING", raw=None, heartbeat="none", consecutive_failures=2, preemptions=4, **FLEX))
    assert (d.action.kind, d.action.provisioning, d.action.zone) == (Act.CREATE, "flex-start", ZONES[1])
    st = d.status
    assert (st.consecutive_failures, st.preemptions, st.failures, st.tried_zones) == (3, 4, 0, [ZONES[0]])
    assert d.cause == "flex_start_unanswered" and d.details["node"] == "job-3"


def test_running_starts_the_flex_start_nodes_life_and_its_run_clock():
    d = core.decide(obs("PROVISIONING", raw="RUNNING", heartbeat="none", node_started_at=NOW - timedelta(hours=1),
                        **FLEX))
    assert d.status.state is State.RUNNING
    assert d.status.node_started_at == NOW and d.status.run_ends_at == NOW + timedelta(hours=24)
    spot = core.decide(obs("PROVISIONING", raw="RUNNING", heartbeat="none", spec=TIERED))
    assert spot.status.run_ends_at is None


def test_the_end_of_the_run_is_a_planned_stop_and_the_next_node_tries_spot_again():
    ended = dict(run_ends_at=NOW - timedelta(seconds=30), preemptions=4, failures=1, restarts=5, **FLEX)
    d = core.decide(obs("RUNNING", raw=None, **ended))
    assert d.cause == losses.RUN_ENDED and d.status.last_cause == losses.RUN_ENDED
    assert (d.status.preemptions, d.status.failures, d.status.restarts) == (4, 1, 6)
    assert (d.action.kind, d.action.provisioning) == (Act.CREATE, "spot")  # every round starts at the first tier
    assert d.alert is None
    deleting = core.decide(obs("RUNNING", raw="STOPPING", **ended))
    assert deleting.cause == losses.RUN_ENDED and deleting.action.kind is Act.DELETE


def test_a_flex_start_node_lost_long_before_its_end_is_a_preemption():
    d = core.decide(obs("RUNNING", raw=None, run_ends_at=NOW + timedelta(hours=5), preemptions=4, **FLEX))
    # Told as every platform loss is (recovery_time.loss_cause), the signal kept beside it.
    assert (d.cause, d.details["signal"]) == ("preempted", "node_gone") and d.status.preemptions == 5


def test_the_agents_run_ending_notice_gets_the_next_node_made_during_it_as_a_planned_stop():
    o = obs("RUNNING", hint=observation.NOTICE, heartbeat="none", run_ends_at=NOW + timedelta(minutes=2), preemptions=4,
            **FLEX)
    d = core.decide(o)
    assert d.action.kind is Act.CREATE and d.action.handover is not None and d.status.leaving.node == "job-3"
    assert d.cause == losses.RUN_ENDED and d.status.preemptions == 4
    far = replace(o, heartbeat=hb("preempting", notice="run-ending"),
                  status=o.status.model_copy(update={"run_ends_at": NOW + timedelta(hours=5)}))
    assert core.decide(far).cause == losses.RUN_ENDED  # the agent said so, whatever the controller's clock says


def test_the_run_ending_notice_message_is_a_planned_stop_before_any_heartbeat_says_so():
    """The agent's message (kind run-ending) may come before its `preempting` beat, and the controller's own idea of
    the end may be far (a clock of its own): the message's kind decides."""
    o = obs("RUNNING", hint=observation.RUN_END_NOTICE, heartbeat="fresh", run_ends_at=NOW + timedelta(hours=5),
            preemptions=4, **FLEX)
    d = core.decide(o)
    assert d.action.kind is Act.CREATE and d.status.leaving.node == "job-3"
    assert d.cause == losses.RUN_ENDED and d.status.preemptions == 4 and d.alert is None
    assert core.decide(replace(o, hint=observation.NOTICE)).cause == "preempted"  # a preemption notice stays one
    # No head start (the message came after the node went): the loss is still the planned stop, not a preemption.
    gone = core.decide(replace(o, node=NodeObs(Phase.ABSENT, None)))
    assert gone.cause == losses.RUN_ENDED and gone.status.preemptions == 4 and gone.action.kind is Act.CREATE


def test_after_a_planned_stop_the_zone_that_served_is_not_avoided():
    """A preemption sends the next node down the zone list (next_zone); the run's end is no fault of its zone."""
    ended = dict(run_ends_at=NOW - timedelta(seconds=30), **FLEX)
    assert core.decide(obs("RUNNING", raw=None, **ended)).action.zone == ZONES[0]
    preempted = core.decide(obs("RUNNING", raw=None, run_ends_at=NOW + timedelta(hours=5), **FLEX))
    assert preempted.action.zone == ZONES[1]


def test_a_run_end_the_agent_handled_is_a_planned_stop_however_late_the_controller_looks():
    """Issue #34: the agent acted on its run's end (emergency save committed, final heartbeat `exited` with the
    run-ending notice) while no replacement could be made during the notice (every zone cooling down: the notice
    pass waited); the VM still runs when the controller looks again and the heartbeat has gone stale. That is the
    run's end, as the first one was: not `stale_heartbeat`, and no preemption counted."""
    final = hb("exited", age=600, exit_code=143, notice="run-ending", step=400, committed_step=400)
    o = obs("RUNNING", raw="RUNNING", run_ends_at=NOW + timedelta(hours=5), preemptions=4, **FLEX)
    d = decide_job(replace(o, heartbeat=final))  # the job's progress (its committed step) is the job's to write
    assert d.cause == losses.RUN_ENDED and d.status.last_cause == losses.RUN_ENDED
    assert (d.status.preemptions, d.status.failures) == (4, 0) and d.details["counted_as"] == "planned"
    assert d.status.last_committed_step == 400 and d.action.kind is Act.DELETE
    # A Spot node's agent that went silent after a preemption notice is still a preemption, and told as one.
    spot = core.decide(replace(obs("RUNNING", raw="RUNNING", preemptions=4, spec=TIERED),
                               heartbeat=hb("exited", age=600, exit_code=143, notice="preempted")))
    assert (spot.cause, spot.details["signal"]) == ("preempted", "stale_heartbeat") and spot.status.preemptions == 5
