"""Placement through the entry points: capacity and quota refusals from sim/ (the real error shapes), recorded in
Firestore so every job avoids the zone; waiting with backoff; on-demand fallback; restart in place."""

from __future__ import annotations

import time

from functions_fixtures import T4, ZONES, controller, gpu_spec  # noqa: F401
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def test_stockout_is_recorded_and_steers_every_job_away_from_the_zone(controller):
    controller.sim.set_capacity(ZONES[0], T4, 0)
    first = controller.register(gpu_spec("first"))
    assert controller.job_created(first) == 200
    st = controller.wait_state(first, "RUNNING")
    assert (st.attempt, st.zone) == (2, ZONES[1])  # attempt 1 was refused in ZONES[0]
    record = controller.capacity()[f"{ZONES[0]}~{T4}"]
    assert (record["reason"], record["code"]) == ("capacity", "ZONE_RESOURCE_POOL_EXHAUSTED")
    causes = [e["cause"] for e in controller.events(first)]
    assert "zone_refused_capacity" in causes
    # Another job asking for the same GPU skips the zone without trying it.
    second = controller.register(gpu_spec("second"))
    assert controller.job_created(second) == 200
    st2 = controller.wait_state(second, "RUNNING")
    assert (st2.attempt, st2.zone) == (1, ZONES[1])


def test_quota_refusal_is_classified_and_recorded(controller):
    controller.sim.set_quota("us-central1", T4, 1)
    a = controller.register(gpu_spec("qa"))
    assert controller.job_created(a) == 200
    controller.wait_state(a, "RUNNING")
    b = controller.register(gpu_spec("qb", zones=["us-central1-b", "us-central1-c"]))
    assert controller.job_created(b) == 200
    st = controller.wait_state(b, "WAITING_FOR_CAPACITY")
    assert "every zone refused" in st.message
    records = controller.capacity()
    assert {records[f"{z}~{T4}"]["code"] for z in ["us-central1-b", "us-central1-c"]} == {"QUOTA_EXCEEDED"}
    assert {records[f"{z}~{T4}"]["reason"] for z in ["us-central1-b", "us-central1-c"]} == {"quota"}


def test_every_zone_refusing_waits_with_backoff_then_recovers_when_capacity_returns(controller):
    for z in ZONES:
        controller.sim.set_capacity(z, T4, 0)
    job = controller.register(gpu_spec("patient", placement={"cooldown_seconds": 1, "max_backoff_seconds": 2}))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "WAITING_FOR_CAPACITY")
    assert st.members[0].next_attempt_at is not None and controller.live(job) == []
    assert [a["type"] for a in controller.alerts(want=1)] == ["waiting_for_capacity"]
    assert controller.sweep() == 200  # before next_attempt_at: nothing is tried
    assert controller.status(job).attempt == st.attempt
    controller.sim.set_capacity(ZONES[2], T4, None)
    while (until := controller.status(job).members[0].next_attempt_at) and time.time() < until.timestamp():
        time.sleep(0.2)
    assert controller.sweep() == 200
    after = controller.wait_state(job, "RUNNING")
    assert after.zone == ZONES[2] and after.members[0].consecutive_failures == 0


def test_on_demand_fallback_after_n_spot_failures(controller):
    for z in ZONES[:2]:
        controller.sim.set_capacity(z, T4, 0, provisioning_model="SPOT")
    spec = gpu_spec("fallback", zones=ZONES[:2],
                    placement={"cooldown_seconds": 0, "on_demand_fallback": True, "fallback_after_failures": 2})
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    # Spot refused in both zones (attempts 1 and 2); the third attempt is on-demand, back in the first zone.
    assert (st.attempt, st.zone, st.provisioning) == (3, ZONES[0], "standard")
    [node] = controller.live(job)
    assert node["labels"]["respawn-job"] == "fallback"


def test_restart_in_place_refused_moves_the_job_to_another_zone(controller):
    job = controller.register(gpu_spec("stuck"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    controller.sim.set_capacity(st.zone, T4, 0)  # the zone has no capacity to start it again
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.attempt, after.zone, after.restarts) == (2, ZONES[1], 1)
    assert controller.sim.status_of(st.zone, st.node) is None and controller.sim.max_live(job) == 1


def test_a_spot_stockout_cools_spot_only_the_next_tier_tries_the_same_zones_at_once(controller):
    """Spot refused in both zones under the default cooldown (minutes): the on-demand tier is created at once in the
    first zone (on-demand capacity is another pool), while a Spot job registered after still skips both zones."""
    for z in ZONES[:2]:
        controller.sim.set_capacity(z, T4, 0, provisioning_model="SPOT")
    spec = gpu_spec("tiered", zones=ZONES[:2], provisioning=[{"model": "spot", "after_refusals": 2}, "standard"])
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.attempt, st.zone, st.provisioning) == (3, ZONES[0], "standard")
    assert "WAITING_FOR_CAPACITY" not in [e.get("to") for e in controller.events(job)]
    record = controller.capacity()[f"{ZONES[0]}~{T4}"]
    assert set(record["until_by_pool"]) == {"spot"} and record["pools"] == ["spot"]
    spot = controller.register(gpu_spec("spot-only", zones=ZONES[:2]))
    assert controller.job_created(spot) == 200
    assert controller.wait_state(spot, "WAITING_FOR_CAPACITY").attempt == 0  # nothing tried: both zones cool
