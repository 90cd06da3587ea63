"""sim/advice.py through the real compute_v1 AdviceClient and RegionsClient: the scores follow what a test set or
the capacity timeline, capacityHistory's days, regions.get's quotas, and the errors (only Spot is scored, faults)."""

from __future__ import annotations

import json

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from respawn import advice
from sim_fixtures import PROJECT, sim_factory, sim_server  # noqa: F401

REGION = "us-central1"
L4 = advice.Shape("g2-standard-8")


def _clients(sim):
    kw = dict(credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": sim.endpoint})
    return compute_v1.AdviceClient(**kw), compute_v1.RegionsClient(**kw)


def _score(client, zone: str, shape=L4, size: int = 1) -> advice.ZoneAdvice | None:
    body = compute_v1.CapacityAdviceRequest.from_json(json.dumps(advice.capacity_request(shape, zone, size)))
    resp = client.capacity(project=PROJECT, region=REGION, capacity_advice_request_resource=body)
    return advice.parse_capacity(json.loads(type(resp).to_json(resp)), zone)


def test_scores_follow_what_was_set_then_the_capacity_timeline(sim_server):
    client, _ = _clients(sim_server)
    sim_server.set_advice("us-central1-a", "g2-standard-8", obtainability=0.2, estimated_uptime=60)
    sim_server.set_capacity("us-central1-b", "g2-standard-8", 0, provisioning_model="SPOT")
    sim_server.set_capacity("us-central1-c", "g2-standard-8", 1)
    sim_server.set_capacity("us-central1-c", "g2-standard-8", 0, at=sim_server.now() + 900)
    assert _score(client, "us-central1-a") == advice.ZoneAdvice(0.2, 60.0)
    assert _score(client, "us-central1-b").obtainability == 0.0  # Spot stocked out
    assert _score(client, "us-central1-c") == advice.ZoneAdvice(0.6, 600.0)  # room for one; it goes in 15 min
    assert _score(client, "us-central1-c", size=2).obtainability == 0.0  # no room for two
    assert _score(client, "us-central1-f").obtainability == 0.9  # unlimited


def test_history_has_thirty_days_with_the_newest_as_set(sim_server):
    client, _ = _clients(sim_server)
    sim_server.set_advice("us-central1-a", "g2-standard-8", preemption_rates=[0.1, 0.4], prices=[0.21])
    body = compute_v1.CapacityHistoryRequest.from_json(json.dumps(advice.history_request(L4, "us-central1-a")))
    resp = client.capacity_history(project=PROJECT, region=REGION, capacity_history_request_resource=body)
    assert resp.location.endswith("/zones/us-central1-a") and resp.machine_type == "g2-standard-8"
    history = advice.parse_history(json.loads(type(resp).to_json(resp)))
    assert len(history.preemption_rates) == 30 and history.preemption_rates[-2:] == (0.1, 0.4)
    assert history.price == (0.21, "USD")
    days = [(r.interval.start_time, r.interval.end_time) for r in resp.preemption_history]
    assert all(a < b for a, b in days) and all(days[i][1] == days[i + 1][0] for i in range(29))


def test_region_lists_the_quotas_in_force_by_metric(sim_server):
    _, regions = _clients(sim_server)
    sim_server.set_quota(REGION, "g2-standard-8", 0, provisioning_model="SPOT")
    sim_server.set_quota(REGION, "g2-standard-8", 8, provisioning_model="STANDARD")
    sim_server.set_quota(REGION, "nvidia-tesla-t4", 3)
    sim_server.set_quota("europe-west4", "nvidia-tesla-t4", 9)
    region = regions.get(project=PROJECT, region=REGION)
    quotas = advice.parse_quotas(json.loads(type(region).to_json(region)))
    assert quotas == {"PREEMPTIBLE_NVIDIA_L4_GPUS": advice.Quota(0, 0), "NVIDIA_L4_GPUS": advice.Quota(8, 0),
                      "PREEMPTIBLE_NVIDIA_T4_GPUS": advice.Quota(3, 0), "NVIDIA_T4_GPUS": advice.Quota(3, 0)}


def test_only_spot_is_scored_and_faults_answer_the_advice_calls(sim_server):
    client, regions = _clients(sim_server)
    body = advice.capacity_request(L4, "us-central1-a")
    body["instanceProperties"]["scheduling"]["provisioningModel"] = "STANDARD"
    with pytest.raises(gexc.BadRequest):
        client.capacity(project=PROJECT, region=REGION,
                        capacity_advice_request_resource=compute_v1.CapacityAdviceRequest.from_json(json.dumps(body)))
    sim_server.set_api_faults(count=1, status=404, methods=("advice",))
    with pytest.raises(gexc.NotFound):
        _score(client, "us-central1-a")
    assert _score(client, "us-central1-a").obtainability == 0.9
    sim_server.set_api_faults(count=1, status=403, methods=("region",))
    with pytest.raises(gexc.Forbidden):
        regions.get(project=PROJECT, region=REGION)
