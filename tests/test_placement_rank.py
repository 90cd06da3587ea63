"""Zones ranked by capacity advice (placement.rank: advice), pure: placement.rank_zones and the strategy's choice.
The ranking reorders the user's zones and never adds one; without advice for every zone, or for a tier advice does
not score, the order is the user's."""

from datetime import datetime, timezone

import pytest

from respawn.advice import ZoneAdvice as Z
from respawn.control.placement import rank_zones
from respawn.control.recovery import strategy_for
from respawn.schema import SlotStatus, parse_spec

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"


@pytest.mark.parametrize("advice, order", [
    ({A: Z(0.2), B: Z(0.9), C: Z(0.5)}, [B, C, A]),  # obtainability first
    ({A: Z(0.5, 60), B: Z(0.5, 3600), C: Z(0.5, 600)}, [B, C, A]),  # then the estimated uptime
    ({A: Z(0.5), B: Z(0.5, 60), C: Z(0.5)}, [B, A, C]),  # an unknown uptime counts as none
    ({A: Z(0.7, 600), B: Z(0.7, 600), C: Z(0.9)}, [C, A, B]),  # equals keep the user's order
    ({A: Z(0.1), B: Z(0.9)}, [A, B, C]),  # C unscored: the user's order
    ({}, [A, B, C]),
    # Advice for zones the user did not list is never a reason to go there.
    ({A: Z(0.1), B: Z(0.2), C: Z(0.3), "europe-west4-a": Z(1.0)}, [C, B, A]),
])
def test_rank_zones(advice, order):
    assert rank_zones([A, B, C], advice) == order


def spec(**over):
    base = {"id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": [A, B, C],
            "trainer": {"command": ["python", "t.py"]}, "checkpoint_uri": "gs://bucket/job",
            "placement": {"rank": "advice"}}
    return parse_spec({**base, **over})


BEST_C = {A: Z(0.1), B: Z(0.4), C: Z(0.9)}


@pytest.mark.parametrize("over, status, blocked, zone, ranked", [
    ({}, {}, {}, C, (C, B, A)),
    ({}, dict(tried_zones=[C]), {}, B, (C, B, A)),  # C refused this round: the next best
    ({}, {}, {C: datetime(2026, 1, 2, tzinfo=timezone.utc)}, B, (C, B, A)),  # C cooling down
    ({}, dict(preempted_zone=C), {}, B, (C, B, A)),  # next_zone: the zone that lost the job goes last
    ({"placement": {}}, {}, {}, A, ()),  # not asked for: the user's order
    ({"provisioning": "standard"}, {}, {}, A, ()),  # advice scores Spot VMs only
    ({"provisioning": [{"model": "spot", "after_refusals": 1}, "standard"]}, dict(consecutive_failures=1), {}, A, ()),
])
def test_the_strategy_walks_the_ranked_zones_for_spot_only(over, status, blocked, zone, ranked):
    s = spec(**over)
    choice = strategy_for(s).choose(s.zones, SlotStatus(**status), blocked, NOW, BEST_C)
    assert (choice.zone, choice.ranked) == (zone, ranked)
    assert choice.zone in s.zones


def test_a_job_without_advice_places_as_listed():
    s = spec()
    assert strategy_for(s).choose(s.zones, SlotStatus(), {}, NOW).zone == A
    assert strategy_for(s).choose(s.zones, SlotStatus(), {}, NOW, {A: Z(0.1), B: Z(0.9)}).zone == A  # C unscored


def test_rank_takes_advice_alone():
    from respawn.schema import SpecError

    assert spec().placement.rank == "advice" and spec(placement={}).placement.rank is None
    with pytest.raises(SpecError, match="placement.rank"):
        spec(placement={"rank": "obtainability"})


# Decision rows: the whole job's decision (functions/job.py, one slot per node) with the advice reconcile observed.
def _decide(state: str, advice, nodes: int = 1, **status):
    from respawn.control import job
    from respawn.control.observation import Observation
    from respawn.schema import JobStatus, MemberStatus, State

    s = spec(nodes=nodes) if nodes > 1 else spec()
    members = [MemberStatus(state=State(state), **status) for _ in range(nodes)]
    st = JobStatus(state=State(state), members=members, **status)
    o = Observation(job_id="job", spec=s, spec_errors=(), status=st, cancel_requested=False, node=job.ABSENT,
                    heartbeat=None, now=NOW, advice=advice)
    return job.decide(o, [job.MemberObs() for _ in range(nodes)])


@pytest.mark.parametrize("state, advice, status, zone, ranked", [
    ("PENDING", BEST_C, {}, C, [C, B, A]),  # the first node, in the most obtainable zone at once
    ("PENDING", {A: Z(0.1), B: Z(0.9)}, {}, A, None),  # C unscored: as listed, and no order named
    ("PENDING", {}, {}, A, None),  # advice failed (reconcile observed none): as listed
    ("WAITING_FOR_CAPACITY", BEST_C, dict(next_attempt_at=NOW), C, [C, B, A]),  # the retry after a wait, too
])
def test_decide_places_the_first_node_by_advice(state, advice, status, zone, ranked):
    d = _decide(state, advice, **status)
    assert (d.action.kind.value, d.action.zone) == ("create", zone)
    assert d.details.get("ranked_zones") == ranked


def test_a_job_of_several_nodes_is_placed_in_its_best_ranked_zone():
    d = _decide("PENDING", BEST_C, nodes=2)
    assert (d.action.kind.value, d.action.zone) == ("create", C)
    assert d.status.zone == C


def test_the_strategys_name_says_the_zones_go_by_advice():
    assert strategy_for(spec()).name == "restart_in_place → next_zone_by_advice"
    assert strategy_for(spec(placement={"strategy": "same_zone", "rank": "advice"})).name == \
        "restart_in_place → same_zone_by_advice"
