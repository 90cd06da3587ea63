"""The control plane through its entry points: a job's life from registration to its end."""

from __future__ import annotations

from functions_fixtures import T4, ZONES, controller, gpu_spec, tpu_spec  # noqa: F401
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def test_job_created_places_a_spot_vm_in_the_first_zone_with_the_agent_contract(controller):
    job = controller.register(gpu_spec("train"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.attempt, st.node, st.zone, st.provisioning) == (1, "train-1", ZONES[0], "spot")
    [node] = controller.live(job)
    assert node["name"] == "train-1" and node["zone"] == ZONES[0]
    assert node["labels"] == {"respawn-job": "train", "respawn-attempt": "1"}
    attrs = node["attributes"]
    assert attrs["respawn-job-id"] == "train" and attrs["respawn-attempt"] == "1"
    assert attrs["respawn-project"] == controller.project
    assert attrs["startup-script"].startswith("#!/bin/bash") and "respawn-agent" in attrs["startup-script"]
    import json

    settings = json.loads(attrs["respawn-settings"])
    assert settings == {"command": ["python", "-m", "trainer.examples.torch_mlp"], "env": {"SEED": "1"},
                        "checkpoint_uri": "gs://respawn-ckpt/train", "heartbeat_seconds": 15, "notice_budget_seconds": 25}
    events = [(e["from_state"], e["to_state"], e["cause"]) for e in controller.events(job)]
    assert events == [("PENDING", "PROVISIONING", "job_created"), ("PROVISIONING", "RUNNING", "node_running")]
