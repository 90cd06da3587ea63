"""placement.rank: advice through the entry points: the controller asks sim/'s advice.capacity through the real
AdviceClient, caches each zone × machine shape in Firestore for every job, places the first node in the best listed
zone, and keeps the user's order (with one WARNING saying why) when advice fails."""

from __future__ import annotations

import json

from functions_fixtures import ZONES, controller, gpu_spec, tpu_spec  # noqa: F401
from sim_fixtures import sim_factory, sim_server  # noqa: F401

RANKED = {"placement": {"cooldown_seconds": 300, "rank": "advice"}}


def test_the_first_node_goes_to_the_most_obtainable_zone_and_the_advice_is_shared(controller, capsys):
    sim = controller.sim
    for zone, score in zip(ZONES, (0.2, 0.5, 0.95)):
        sim.set_advice(zone, "n1-standard-8", obtainability=score)
    first = controller.register(gpu_spec("ranked-a", **RANKED))
    assert controller.job_created(first) == 200
    st = controller.wait_state(first, "RUNNING")
    assert (st.attempt, st.zone) == (1, ZONES[2])
    [created] = [e for e in controller.events(first) if e["cause"] == "job_created"]
    assert created["details"]["ranked_zones"] == [ZONES[2], ZONES[1], ZONES[0]]
    cached = {s.id: s.to_dict() for s in controller.db.collection("advice").stream()}
    key = "n1-standard-8+1xnvidia-tesla-t4"
    assert {f"{z}~{key}" for z in ZONES} <= set(cached) and cached[f"{ZONES[2]}~{key}"]["obtainability"] == 0.95
    # A second job of the same shape uses the cached advice: advice.capacity failing now changes nothing.
    sim.set_api_faults(count=10, status=500, methods=("advice",))
    second = controller.register(gpu_spec("ranked-b", **RANKED))
    assert controller.job_created(second) == 200
    assert controller.wait_state(second, "RUNNING").zone == ZONES[2]
    assert sim.api_faults["count"] == 10, "the cached advice was asked again"
    assert "capacity advice" not in capsys.readouterr().out


def test_advice_that_fails_keeps_the_users_order_with_one_warning(controller, capsys):
    controller.sim.set_advice(ZONES[2], "n1-standard-8", obtainability=0.95)
    controller.sim.set_api_faults(count=1, status=404, methods=("advice",))
    job = controller.register(gpu_spec("unranked", **RANKED))
    assert controller.job_created(job) == 200
    assert controller.wait_state(job, "RUNNING").zone == ZONES[0]
    warnings = [json.loads(x) for x in capsys.readouterr().out.splitlines()
                if x.startswith("{") and "capacity advice" in x]
    assert len(warnings) == 1 and warnings[0]["severity"] == "WARNING"
    assert "NotFound" in warnings[0]["message"] and ZONES[0] in warnings[0]["message"]
    assert "compute.advice.capacity" in warnings[0]["message"]


def test_a_tpu_job_is_never_ranked(controller):
    # Advice cannot score TPUs (gcp-facts §20): none is asked, the zones keep the order listed.
    job = controller.register(tpu_spec("tpu-ranked", **RANKED))
    assert controller.job_created(job) == 200
    assert controller.wait_state(job, "RUNNING").zone == ZONES[0]
    assert list(controller.db.collection("advice").stream()) == []
