"""functions/recovery.py: the named recovery strategies, table-driven. Pure: a spec and a status in, a choice out."""

from datetime import datetime, timedelta, timezone

import pytest

from respawn.control.recovery import Strategy, strategy_for
from respawn.schema import SlotStatus, SpecError, parse_spec

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
SOON = NOW + timedelta(seconds=5)


def spec(**over):
    base = {"id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": [A, B, C],
            "trainer": {"command": ["python", "t.py"]}, "checkpoint_uri": "gs://bucket/job"}
    return parse_spec({**base, **over})


TPU = {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}
FALLBACK = {"on_demand_fallback": True, "fallback_after_failures": 2}


@pytest.mark.parametrize("over, name", [
    ({}, "restart_in_place → next_zone"),  # a GPU Spot VM is stopped by a preemption (the default)
    ({"termination_action": "DELETE"}, "next_zone"),
    ({"accelerator": TPU}, "next_zone"),  # a preempted TPU is never started again
    ({"placement": {"avoid_preempting_zone": False}}, "restart_in_place → in_order"),  # the older spelling
    ({"placement": {"strategy": "same_zone"}, "termination_action": "DELETE"}, "same_zone"),
    ({"placement": FALLBACK}, "restart_in_place → next_zone → on_demand_after_2"),
    ({"placement": FALLBACK, "provisioning": "standard"}, "next_zone"),  # on-demand already: nothing to fall back to
])
def test_the_strategy_is_chosen_in_one_place_from_the_spec(over, name):
    assert strategy_for(spec(**over)).name == name


LOST_IN_A = dict(preempted_zone=A)


@pytest.mark.parametrize("order, status, blocked, zone", [
    # Every order walks the list, skipping zones cooling down and zones that refused this round.
    ("next_zone", {}, {}, A),
    ("next_zone", {}, {A: SOON}, B),
    ("next_zone", {}, {A: NOW - timedelta(seconds=1)}, A),  # a cooldown that ended
    ("next_zone", dict(tried_zones=[A, B]), {}, C),
    ("next_zone", dict(tried_zones=[A, B, C]), {}, None),  # every zone refused: wait
    ("in_order", dict(tried_zones=[A], **LOST_IN_A), {}, B),
    ("same_zone", dict(tried_zones=[A], **LOST_IN_A), {}, B),  # the zone that lost it refused since
    # The zone that just lost the job: last, in its place, or first.
    ("next_zone", LOST_IN_A, {}, B),
    ("in_order", LOST_IN_A, {}, A),
    ("same_zone", dict(preempted_zone=C), {}, C),
    ("same_zone", dict(preempted_zone=C), {C: SOON}, A),  # cooling down: not even the same zone
    ("next_zone", dict(preempted_zone=C, tried_zones=[A, B]), {}, C),  # the only zone left: a job still recovers
])
def test_zone_orders(order, status, blocked, zone):
    choice = Strategy(order, False).choose(spec().zones, SlotStatus(**status), blocked, NOW)
    assert (choice.zone, choice.provisioning) == (zone, "spot")
    assert set(choice.skipped) == {z for z in (A, B, C) if z in status.get("tried_zones", []) or
                                   (z in blocked and blocked[z] > NOW)}


@pytest.mark.parametrize("failures, provisioning, tried, expect", [
    (1, "spot", [], (A, "spot")),
    (2, "spot", [], (A, "standard")),  # K refusals in a row: on-demand
    (2, "spot", [A, B, C], (A, "standard")),  # the Spot round's refusals do not count against on-demand: a new round
    (3, "standard", [A, B, C], (None, "standard")),  # on-demand refused everywhere too: wait
])
def test_on_demand_fallback_after_refusals_in_a_row(failures, provisioning, tried, expect):
    status = SlotStatus(consecutive_failures=failures, provisioning=provisioning, tried_zones=tried)
    choice = strategy_for(spec(placement=FALLBACK)).choose(spec(placement=FALLBACK).zones, status, {}, NOW)
    assert (choice.zone, choice.provisioning) == expect
    assert strategy_for(spec()).model(status, NOW) == "spot"  # without the fallback: never


@pytest.mark.parametrize("over, status, blocked, restarts", [
    ({}, dict(zone=A, provisioning="spot"), {}, True),
    ({}, dict(zone=A, provisioning="spot", in_place_restarts=1), {}, False),  # restarted once already
    ({}, dict(zone=A, provisioning="spot"), {A: SOON}, False),  # the zone is short of capacity: go elsewhere
    ({}, dict(zone=A, provisioning="standard"), {}, False),  # fallen back to on-demand: no Spot VM to restart
    ({"termination_action": "DELETE"}, dict(zone=A, provisioning="spot"), {}, False),  # deleted: nothing to start
])
def test_restart_in_place(over, status, blocked, restarts):
    assert strategy_for(spec(**over)).in_place(SlotStatus(**status), blocked, NOW, max_restarts=1) is restarts


def test_a_spec_names_the_zone_order_once():
    assert strategy_for(spec(placement={"strategy": "in_order"})).order == "in_order"
    with pytest.raises(SpecError, match="keep strategy alone"):
        spec(placement={"strategy": "same_zone", "avoid_preempting_zone": False})


TIERS = [{"model": "spot", "after_refusals": 2, "after_preemptions": {"max": 2, "window_hours": 6}},
         {"model": "flex-start", "max_run_hours": 24}, "standard"]


def ago(*hours):
    return [NOW - timedelta(hours=h) for h in hours]


@pytest.mark.parametrize("failures, preempted, expect, why", [
    (0, [], "spot", ""),
    (1, ago(1, 2), "spot", ""),  # within both limits
    (2, [], "flex-start", "spot: refused 2 times in a row"),
    (4, [], "flex-start", "spot: refused 2 times in a row"),  # flex-start's own default: 3 refusals
    (5, [], "standard", "spot: refused 2 times in a row; flex-start: refused 3 times in a row"),
    (0, ago(1, 2, 3), "flex-start", "spot: more than 2 preemptions within 6 h"),  # give up on Spot for a while
    (0, ago(1, 2, 7), "spot", ""),  # the third is older than the window: Spot again
    (3, ago(1, 2, 3), "standard", "spot: more than 2 preemptions within 6 h; flex-start: refused 3 times in a row"),
])
def test_provisioning_tiers_move_on_after_refusals_or_preemptions(failures, preempted, expect, why):
    s = spec(provisioning=TIERS, termination_action="DELETE")
    status = SlotStatus(consecutive_failures=failures, preempted_times=preempted)
    choice = strategy_for(s).choose(s.zones, status, {}, NOW)
    assert (choice.zone, choice.provisioning, choice.why) == (A, expect, why)


def test_tiers_name_the_strategy_and_the_older_fallback_is_two_tiers():
    assert strategy_for(spec(provisioning=TIERS)).name == (
        "restart_in_place → next_zone → flex_start_after_2_or_2_preemptions_per_6h → on_demand_after_3")
    old, new = spec(placement=FALLBACK), spec(provisioning=[{"model": "spot", "after_refusals": 2}, "standard"])
    assert strategy_for(old).name == strategy_for(new).name == "restart_in_place → next_zone → on_demand_after_2"


def test_a_spot_cooldown_does_not_keep_the_next_tier_out_of_the_zone():
    from respawn.control.placement import pool_key

    s = spec(provisioning=[{"model": "spot", "after_refusals": 2}, {"model": "flex-start"}, "standard"])
    cooling = {pool_key(z, "spot"): SOON for z in (A, B, C)}
    spot = strategy_for(s).choose(s.zones, SlotStatus(provisioning="spot", consecutive_failures=1), cooling, NOW)
    assert (spot.zone, spot.provisioning) == (None, "spot")
    flex = strategy_for(s).choose(s.zones, SlotStatus(provisioning="spot", consecutive_failures=2), cooling, NOW)
    assert (flex.zone, flex.provisioning, flex.skipped) == (A, "flex-start", ())
    quota = {**cooling, **{pool_key(z, "flex-start"): SOON for z in (A, B)}}
    assert strategy_for(s).choose(s.zones, SlotStatus(provisioning="spot", consecutive_failures=2), quota, NOW).zone == C


def test_a_tier_is_taken_only_while_the_budget_allows():
    s = spec(provisioning=["spot", {"model": "standard", "while_budget_below": 0.8}], budget={"max_usd": 100})
    st = SlotStatus(provisioning="spot", consecutive_failures=3)
    assert strategy_for(s).tier(st, NOW, budget_used=0.5)[0].model == "standard"  # on-demand while under 80 %
    tier, why = strategy_for(s).tier(st, NOW, budget_used=0.85)
    assert tier.model == "spot" and why == "standard: 85% of the budget spent (only below 80%)"  # Spot waits instead
    assert strategy_for(s).tier(st, NOW)[0].model == "standard"  # no ledger yet: the rule says nothing
    both = spec(provisioning=[{"model": "spot", "while_budget_below": 0.5}, {"model": "standard", "while_budget_below": 0.5}],
                budget={"max_usd": 100})
    assert strategy_for(both).tier(SlotStatus(), NOW, budget_used=0.9)[0].model == "spot"  # none left: the first
    with pytest.raises(SpecError, match="while_budget_below is a share of the budget: give budget.max_usd"):
        spec(provisioning=["spot", {"model": "standard", "while_budget_below": 0.8}])
