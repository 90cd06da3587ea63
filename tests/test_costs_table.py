"""The cost ledger and the budget (functions/costs.py, functions/job.py), row by row. Pure: an Observation and
what each slot's node is in, a Decision out; every figure is computed by hand from the rates below."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from respawn import ledger
from respawn.control import alerts, costs, job
from respawn.control.actions import Act
from respawn.control.observation import ABSENT, NodeObs, Observation, Phase
from respawn.control.outcomes import Outcome, OutcomeKind
from respawn.control.job import MemberObs
from respawn.prices import Quote, Rate
from respawn.schema import (BilledLife, CostLedger, Heartbeat, JobStatus, Leaving, MemberStatus, NodeState, SpecError,
                            State, parse_spec)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
ZONES = ["us-central1-a", "us-central1-b"]
NOTE = "Cloud Billing Catalog of 2026-11-26 (us-central1)"
SPOT, ON_DEMAND = 0.40, 1.00  # USD an hour: round figures, so each row's arithmetic reads at a glance
QUOTE = Quote({"spot": Rate(SPOT, ON_DEMAND, NOTE), "preemptible": Rate(SPOT, ON_DEMAND, NOTE),
               "standard": Rate(ON_DEMAND, ON_DEMAND, NOTE), "flex-start": Rate(ON_DEMAND, ON_DEMAND, NOTE)})
RUNNING = NodeObs(Phase.RUNNING, "RUNNING")
STARTED = NOW - timedelta(hours=3)


def spec(budget: float | None = None, **over):
    data = {"id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": ZONES,
            "trainer": {"command": ["python", "t.py"]}, "checkpoint_uri": "gs://bucket/job",
            "termination_action": "DELETE", **over}
    if budget is not None:
        data["budget"] = {"max_usd": budget}
    return parse_spec(data)


def beat(attempt: int, state: str = "training") -> Heartbeat:
    return Heartbeat(job_id="job", attempt=attempt, state=NodeState(state), step=10, committed_step=8,
                     heartbeat_at=NOW - timedelta(seconds=2))


def life(attempt: int, hours: float, rate: float = SPOT) -> BilledLife:
    return BilledLife(node=f"job-{attempt}", started_at=STARTED, since=NOW - timedelta(hours=hours),
                      usd_per_hour=rate, on_demand_usd_per_hour=ON_DEMAND)


def running(attempt=1, billing=None, closed=0.0, closed_od=0.0, state=State.RUNNING, **cost) -> JobStatus:
    m = MemberStatus(state=state, attempt=attempt, node=f"job-{attempt}", zone=ZONES[0], provisioning="spot",
                     create_state="created", node_started_at=STARTED, billing=billing)
    top = {k: getattr(m, k) for k in ("state", "node", "zone", "provisioning")}
    return JobStatus(**top, attempt=attempt, members=[m], cost=CostLedger(
        closed_usd=closed, closed_on_demand_usd=closed_od, note=NOTE if billing or closed else None, **cost))


def observe(status: JobStatus, the_spec=None, quote: Quote | None = QUOTE, cancel=False, **kw) -> Observation:
    return Observation(job_id="job", spec=the_spec if the_spec is not None else spec(), spec_errors=(), status=status,
                       cancel_requested=cancel, node=ABSENT, heartbeat=None, now=NOW, quote=quote, **kw)


def test_a_node_seen_running_opens_its_life_at_its_models_price():
    provisioning = running(state=State.PROVISIONING)
    assert costs.needs_quote(provisioning)
    d = job.decide(observe(provisioning), [MemberObs(RUNNING, beat(1, "preparing"))])
    assert d.status.state is State.RUNNING
    b = d.status.members[0].billing
    assert (b.node, b.since, b.usd_per_hour, b.on_demand_usd_per_hour) == ("job-1", NOW, SPOT, ON_DEMAND)
    assert d.status.cost.note == NOTE and not costs.needs_quote(d.status)


def test_a_node_without_a_price_runs_unpriced_and_says_why():
    why = "c3-standard-8 is a type respawn/prices.py cannot price"
    d = job.decide(observe(running(state=State.PROVISIONING), quote=Quote({}, why)),
                   [MemberObs(RUNNING, beat(1, "preparing"))])
    assert d.status.members[0].billing is None and d.status.cost.unpriced == why
    # Its node ran: the summary says it is unpriced and why, never that no node has run.
    summary = ledger.summary(d.status, NOW)
    assert summary["prices"] == "no prices" and summary["unpriced"] == why
    assert ledger.summary(JobStatus(), NOW)["prices"] == "none yet (no node has run)"


def test_the_cost_so_far_is_the_closed_lives_plus_each_open_life_to_now():
    s = running(billing=life(1, 2.5), closed=1.2, closed_od=3.0)
    assert costs.spent(s, NOW) == pytest.approx((1.2 + 2.5 * SPOT, 3.0 + 2.5 * ON_DEMAND))
    assert costs.burn(s) == SPOT


def test_a_lost_node_closes_its_life_when_its_replacement_is_committed():
    s = running(billing=life(1, 2.0), closed=1.0, closed_od=2.0)
    d = job.decide(observe(s, hint="preempted"), [MemberObs(ABSENT)])  # gone: the replacement is placed at once
    assert d.action.kind is Act.CREATE and d.action.node == "job-2"
    assert d.status.members[0].billing is None
    assert (d.status.cost.closed_usd, d.status.cost.closed_on_demand_usd) == pytest.approx(
        (1.0 + 2.0 * SPOT, 2.0 + 2.0 * ON_DEMAND))
    # The replacement's life opens once it is seen running.
    booting = job.after_act("job", d.status, d.action, Outcome(OutcomeKind.DONE), NOW)
    after = job.decide(observe(booting.status or d.status), [MemberObs(RUNNING, beat(2, "preparing"))])
    assert after.status.members[0].billing.node == "job-2"
    assert after.status.cost.closed_usd == pytest.approx(1.0 + 2.0 * SPOT)  # the closed life is counted once


def test_a_restart_in_place_is_another_life():
    s = running(billing=life(1, 1.0))
    moved = s.model_copy(update={"members": [s.members[0].model_copy(update={"node_started_at": NOW})]})
    booked = costs.account(s, moved, NOW, QUOTE)
    assert booked.members[0].billing.since == NOW and booked.cost.closed_usd == pytest.approx(SPOT)


def test_the_job_over_closes_every_life():
    d = job.decide(observe(running(billing=life(1, 1.5)), cancel=True), [MemberObs(RUNNING, beat(1))])
    assert d.status.state is State.CANCELLED and d.action.kind is Act.DELETE
    assert d.status.members[0].billing is None and d.status.cost.closed_usd == pytest.approx(1.5 * SPOT)


@pytest.mark.parametrize("spent_hours,cap,sent,due", [
    (1.0, 1.0, 0, None),  # $0.40 of $1: 40 %
    (1.25, 1.0, 0, 50),  # $0.50: 50 %, once
    (1.25, 1.0, 50, None),
    (2.0, 1.0, 50, 80),  # $0.80: 80 %
    (2.0, 1.0, 0, 80),  # both passed at once: the higher one alone
])
def test_budget_alerts_at_50_and_80_percent_once_each(spent_hours, cap, sent, due):
    s = running(billing=life(1, spent_hours), alerted_percent=sent)
    assert costs.alert_due(s, cap, NOW) == due
    d = job.decide(observe(s, spec(budget=cap * 10)), [MemberObs(RUNNING, beat(1))])  # far from this cap: no alert
    assert d.alert is None or d.alert["type"] != "budget"
    if due is not None:
        d = job.decide(observe(s, spec(budget=cap)), [MemberObs(RUNNING, beat(1))])
        assert d.alert["type"] == "budget" and d.alert["percent"] == due
        assert d.status.cost.alerted_percent == due and d.status.revision == s.revision + 1
        assert d.alert["cost_usd"] == pytest.approx(spent_hours * SPOT)
        # Slack's words (the budget demo scenario's, moved down from tests/test_demo_scenarios.py).
        said = alerts.to_slack(d.alert)["text"]
        assert said.startswith("Job job has spent part of its budget") and f"{due} % of the budget" in said, said


def test_at_the_cap_every_node_is_deleted_and_the_job_stops_budget_exhausted():
    # $0.40 an hour, $1.00 spent: the cap of $1.01 would be passed before the next look (150 s = $0.0167).
    s = running(billing=life(1, 2.5))
    d = job.decide(observe(s, spec(budget=1.01)), [MemberObs(RUNNING, beat(1))])
    assert d.status.state is State.BUDGET_EXHAUSTED and d.cause == "budget_exhausted"
    assert (d.action.kind, d.action.node) == (Act.DELETE, "job-1")  # the cancel's delete: the guest's soft-off
    assert d.alert["type"] == "budget_exhausted" and d.alert["percent"] == 100 and "respawn jobs resume job --budget" in d.alert["message"]
    assert alerts.to_slack(d.alert)["text"].startswith("Job job reached its budget: checkpointed and stopped")
    assert d.status.members[0].billing is None and d.status.cost.closed_usd == pytest.approx(1.0)
    assert d.status.cost.stopped_at_budget_usd == 1.01
    # With more than the look-ahead left, it runs on.
    on = job.decide(observe(s, spec(budget=1.03)), [MemberObs(RUNNING, beat(1))])
    assert on.status is None or on.status.state is State.RUNNING
    # Terminal: the node still there is deleted at every pass, and nothing is created.
    again = job.decide(observe(d.status, spec(budget=1.01)), [MemberObs(RUNNING, beat(1))])
    assert again.action.kind is Act.DELETE and again.status is None


def test_at_the_cap_a_job_of_several_nodes_deletes_every_node_in_the_pass_that_stops_it():
    """Issue #34: a 3-node hybrid job stopped at its budget deleted one node a pass, each after the previous one's
    soft-off, and the sweep's orphan scan found the last one first (the job was already BUDGET_EXHAUSTED). The
    pass that stops the job deletes every node it leaves, the node a slot replaced during its notice included."""
    s = running(billing=life(1, 2.5))
    leaving = Leaving(node="job-9", zone=ZONES[0], attempt=9, until=NOW + timedelta(seconds=20))
    members = [s.members[0].model_copy(update={"provisioning": "standard"}),
               *(s.members[0].model_copy(update={"node": f"job-{i}", "attempt": i, "billing": None}) for i in (2, 3))]
    members[2] = members[2].model_copy(update={"leaving": leaving})
    s = s.model_copy(update={"members": members, "attempt": 9})
    three = spec(budget=1.01, nodes=3, on_demand_nodes=1)
    seen = [MemberObs(RUNNING, beat(i)) for i in (1, 2, 3)]
    d = job.decide(observe(s, three), seen)
    assert d.status.state is State.BUDGET_EXHAUSTED and d.cause == "budget_exhausted"
    assert d.action == job.DeleteNodes(((2, ZONES[0], "job-9"), (0, ZONES[0], "job-1"), (1, ZONES[0], "job-2"),
                                        (2, ZONES[0], "job-3")))
    assert [m.leaving for m in d.status.members] == [None, None, None]
    # A node already being deleted is not asked again; with nothing else left the pass polls it.
    deleting = [MemberObs(NodeObs(Phase.DELETING, "DELETING")), MemberObs(RUNNING), MemberObs(ABSENT)]
    again = job.decide(observe(d.status, three), deleting)
    assert again.action.kind is Act.DELETE and (again.action.node, again.action.slot) == ("job-2", 1)
    assert job.decide(observe(d.status, three), deleting[:1] + [MemberObs(ABSENT)] * 2).action.kind is Act.POLL


def test_no_new_node_for_a_job_whose_closed_lives_reached_the_cap():
    s = JobStatus(state=State.PREEMPTED, attempt=1, cost=CostLedger(closed_usd=5.0, closed_on_demand_usd=9.0))
    d = job.decide(observe(s, spec(budget=5.0)), [])
    assert d.status.state is State.BUDGET_EXHAUSTED and d.action.kind is not Act.CREATE


def test_a_raised_budget_resumes_the_job_once_no_node_is_left():
    stopped = running(state=State.BUDGET_EXHAUSTED, closed=1.0, alerted_percent=100, stopped_at_budget_usd=1.02)
    stopped = stopped.model_copy(update={"state": State.BUDGET_EXHAUSTED})
    # The cap not raised: it stays stopped, although it stopped a little below it (the look-ahead).
    assert job.decide(observe(stopped, spec(budget=1.02)), [MemberObs(ABSENT)]).status is None
    # Raised, a node still there: deleted first.
    d = job.decide(observe(stopped, spec(budget=2.0)), [MemberObs(RUNNING, beat(1))])
    assert d.action.kind is Act.DELETE and (d.status is None or d.status.state is State.BUDGET_EXHAUSTED)
    # Raised, none left: PENDING again, its ledger kept, its alerts re-armed for the new cap ($1 of $2: the 50 %
    # alert at once); then placed with the next attempt.
    d = job.decide(observe(stopped, spec(budget=2.0)), [MemberObs(ABSENT)])
    assert d.status.state is State.PENDING and d.cause == "budget_raised" and d.status.members == []
    assert d.status.cost.closed_usd == 1.0 and d.status.cost.alerted_percent == 50 and d.alert["percent"] == 50
    d = job.decide(observe(stopped, spec(budget=3.0)), [MemberObs(ABSENT)])
    assert d.status.cost.alerted_percent == 0 and d.alert is None
    placed = job.decide(observe(d.status, spec(budget=2.0)), [])
    assert placed.action.kind is Act.CREATE and placed.action.node == "job-2"


def test_other_alerts_carry_the_cost_so_far():
    s = running(billing=life(1, 1.0), closed=0.6, closed_od=1.0)
    s = s.model_copy(update={"last_committed_step": 8})
    done = Heartbeat(job_id="job", attempt=1, state=NodeState.EXITED, exit_code=0, step=10, committed_step=10,
                     total_steps=10, heartbeat_at=NOW)
    d = job.decide(observe(s), [MemberObs(RUNNING, done)])
    assert d.alert["type"] == "succeeded"
    assert (d.alert["cost_usd"], d.alert["on_demand_usd"], d.alert["cost_note"]) == (1.0, 2.0, NOTE)
    assert "cost so far: $1.00 (on demand: $2.00)" in alerts.to_slack(d.alert)["text"]


def test_a_budget_needs_a_type_respawn_can_price_and_a_positive_cap():
    assert spec(budget=2.5).budget.max_usd == 2.5
    with pytest.raises(SpecError, match="budget: Respawn cannot price c3-standard-8"):
        spec(budget=2.5, accelerator={"kind": "gpu", "machine_type": "c3-standard-8"})
    with pytest.raises(SpecError, match="budget.max_usd"):
        spec(budget=0)


def test_each_member_of_a_several_node_job_is_its_own_life():
    """Three slots: slot 0 on demand, 1 and 2 Spot; slot 2's node lost and already gone: its life alone closes."""
    three = spec(nodes=3, on_demand_nodes=1)
    members = [MemberStatus(state=State.RUNNING, attempt=i + 1, node=f"job-{i + 1}", zone=ZONES[0], create_state="created",
                            provisioning="standard" if i == 0 else "spot", node_started_at=STARTED,
                            address=f"10.0.0.{i + 1}", generation_sent=1,
                            billing=life(i + 1, 2.0, ON_DEMAND if i == 0 else SPOT)) for i in range(3)]
    s = JobStatus(state=State.RUNNING, attempt=3, zone=ZONES[0], node="job-1", members=members,
                  generation={"number": 1, "members": ["job-1", "job-2", "job-3"], "master_addr": "10.0.0.1"})
    assert costs.burn(s) == pytest.approx(ON_DEMAND + 2 * SPOT)
    seen = [MemberObs(RUNNING, beat(1)), MemberObs(RUNNING, beat(2)), MemberObs(ABSENT)]
    d = job.decide(observe(s, three), seen)
    assert d.status.members[2].billing is None and d.status.members[0].billing == members[0].billing
    assert d.status.cost.closed_usd == pytest.approx(2.0 * SPOT)


def test_the_on_demand_tier_is_taken_only_while_the_budget_allows():
    """Spot refused three times in a row: on-demand while the job has spent under 80 % of its budget, Spot again
    (the refused zones' round over) once it has spent more."""
    tiered = spec(budget=10.0, provisioning=["spot", {"model": "standard", "while_budget_below": 0.8}])

    def next_model(closed_usd: float) -> str:
        s = running(closed=closed_usd, closed_od=closed_usd)
        m = s.members[0].model_copy(update={"state": State.PROVISIONING, "create_state": "failed",
                                            "consecutive_failures": 3, "tried_zones": [], "node": "job-1"})
        s = s.model_copy(update={"members": [m], "state": State.PROVISIONING})
        d = job.decide(observe(s, tiered), [MemberObs(ABSENT, None)])
        assert d.action.kind is Act.CREATE, d
        return d.action.provisioning

    assert next_model(5.0) == "standard"  # 50 % spent
    assert next_model(8.5) == "spot"  # 85 % spent: on-demand is passed over
