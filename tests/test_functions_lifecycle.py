"""The control plane through its entry points: a job's life from registration to its end."""

from __future__ import annotations

import time

import pytest

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
    assert settings == {"command": ["python", "-m", "respawn.ckpt.examples.torch_mlp"], "env": {"SEED": "1"},
                        "checkpoint_uri": "gs://respawn-ckpt/train", "heartbeat_seconds": 15, "notice_budget_seconds": 25,
                        "notice_seconds": 0,
                        "metadata_wait_seconds": 60, "workdir": None, "setup": [], "interpreter": "python3",
                        "setup_timeout_seconds": 3600, "sweep_topic": controller.sweep_topic,
                        "heartbeat_database": None, "cache": [], "cloud_logging": True, "image": None}  # no node identity pool here
    events = [(e["from_state"], e["to_state"], e["cause"]) for e in controller.events(job)]
    assert events == [("PENDING", "PROVISIONING", "job_created"), ("PROVISIONING", "RUNNING", "node_running")]


def _running(controller, spec):
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    return job, controller.wait_state(job, "RUNNING")


def _swept_until(controller, job, state, timeout=30):
    """Sweep the job until it is in `state`: a replacement after a failure waits out its backoff (1 s here)."""
    deadline = time.monotonic() + timeout
    while (st := controller.status(job)).state.value != state:
        assert time.monotonic() < deadline, f"job {job} is {st.state.value} ({st.message}), not {state}"
        assert controller.sweep(job) == 200
        time.sleep(0.2)
    return st


def _reports(controller, job, node, resumed):
    """The node's trainer, restored from step `resumed`, reports its first step: the recovery is complete, and Slack
    hears of it."""
    controller.heartbeat(node, step=resumed + 1, committed_step=resumed)
    assert controller.sweep(job) == 200


def test_stop_terminated_spot_vm_is_restarted_in_place_and_slack_hears_it(controller):
    job, st = _running(controller, gpu_spec("inplace"))
    controller.heartbeat(st.node, step=40, committed_step=30)
    controller.sweep()  # records progress
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.node, after.zone, after.attempt, after.restarts, after.members[0].in_place_restarts) == (st.node, st.zone, 1, 1, 1)
    assert after.steps_lost == 10 and after.last_cause == "preempted"
    [node] = controller.live(job)
    assert node["status"] == "RUNNING"
    assert controller.alerts(timeout=1) == []  # not before it trains again
    _reports(controller, job, after.node, resumed=30)
    [alert] = controller.alerts(want=1)
    assert alert["type"] == "recovered" and alert["in_place"] is True
    assert (alert["old_zone"], alert["new_zone"], alert["steps_lost"], alert["restarts"]) == (st.zone, st.zone, 10, 1)


def test_preempted_vm_is_deleted_and_replaced_in_the_next_zone(controller):
    job, st = _running(controller, gpu_spec("moves", termination_action="DELETE"))
    controller.heartbeat(st.node, step=100, committed_step=96)
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.attempt, after.node, after.zone, after.restarts) == (2, "moves-2", ZONES[1], 1)
    assert [n["name"] for n in controller.live(job)] == ["moves-2"]
    assert controller.sim.max_live("moves") == 1
    _reports(controller, job, after.node, resumed=96)
    [alert] = controller.alerts(want=1)
    assert (alert["type"], alert["old_zone"], alert["new_zone"], alert["steps_lost"]) == ("recovered", ZONES[0], ZONES[1], 4)
    assert alert["recovery_seconds"] >= 0
    events = controller.events(job)
    causes = [(e["from_state"], e["to_state"], e["cause"]) for e in events][-3:]
    assert (after.preemptions, after.failures) == (1, 0)
    assert causes == [("RUNNING", "PROVISIONING", "preempted"), ("PROVISIONING", "RUNNING", "node_running"),
                      ("RUNNING", "RUNNING", "recovered")]
    # The event and the alert carry the one figure (recovery_time).
    assert {k: events[-1]["details"][k] for k in ("recovery_seconds", "steps_lost", "notice_at")} == {
        k: alert[k] for k in ("recovery_seconds", "steps_lost", "notice_at")}


def test_a_multi_host_slice_serves_only_while_every_worker_beats(controller):
    # v4-16: two worker VMs, two heartbeat documents. Both beating: the sweep records the slice's progress (the
    # newest committed step any worker reports). Worker 1 silent while worker 0 still beats: the slice is lost and
    # replaced as a unit (a new node, the old one deleted). Reading worker 0 alone would keep the job RUNNING.
    job, st = _running(controller, tpu_spec("slice", accelerator={
        "kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}))
    controller.heartbeat(st.node, step=50, committed_step=40)
    controller.heartbeat(st.node, worker=1, step=50, committed_step=45)
    controller.sweep()
    assert controller.status(job).last_committed_step == 45
    controller.advance(6)  # worker 1 falls silent past the threshold (5 s in the tests); worker 0 goes on beating
    controller.heartbeat(st.node, step=60, committed_step=45)
    controller.sweep()
    after = _swept_until(controller, job, "RUNNING")  # a silent worker is a failure: the backoff first
    assert (after.attempt, after.node, after.last_cause) == (2, "slice-2", "stale_heartbeat"), after
    assert [n["name"] for n in controller.live(job)] == ["slice-2"]


def test_preempted_tpu_is_deleted_before_its_replacement_so_it_never_holds_quota(controller):
    # One TPU of quota in the region: the replacement can only be created once the preempted node is gone.
    controller.sim.set_quota("us-central1", "v5litepod-8", 1)
    job, st = _running(controller, tpu_spec("jax"))
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    assert entry["protoPayload"]["methodName"] == "tpu.nodes.terminate"
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.attempt, after.node, after.zone) == (2, "jax-2", ZONES[1])
    assert [n["name"] for n in controller.live(job)] == ["jax-2"]
    assert controller.sim.status_of(st.zone, st.node) is None
    assert controller.sim.max_live("jax") == 1


def test_trainer_exit_0_succeeds_and_deletes_the_node(controller):
    job, st = _running(controller, gpu_spec("done"))
    controller.heartbeat(st.node, state="exited", exit_code=0, step=500, committed_step=500)
    assert controller.sweep() == 200
    after = controller.wait_state(job, "SUCCEEDED")
    assert after.last_committed_step == 500
    assert controller.live(job) == [] and controller.sim.status_of(st.zone, st.node) is None
    [alert] = controller.alerts(want=1)
    assert alert["type"] == "succeeded" and alert["committed_step"] == 500


def test_trainer_crash_restarts_on_a_new_node_with_an_alert(controller):
    job, st = _running(controller, gpu_spec("crashy"))
    controller.heartbeat(st.node, state="exited", exit_code=3, step=70, committed_step=60, output_tail="ValueError: nan")
    assert controller.sweep() == 200
    waiting = controller.status(job)  # a failure: the next node waits out the backoff (1 s here)
    assert waiting.state.value == "RESTARTING" and waiting.members[0].next_attempt_at is not None  # never PREEMPTED
    after = _swept_until(controller, job, "RUNNING")
    assert (after.attempt, after.restarts, after.last_cause, after.exit_code) == (2, 1, "trainer_crashed", 3)
    assert (after.failures, after.preemptions, after.failure_streak) == (1, 0, 1)
    assert [n["name"] for n in controller.live(job)] == ["crashy-2"]
    _reports(controller, job, after.node, resumed=60)
    kinds = [a["type"] for a in controller.alerts(want=2)]
    assert kinds == ["crashed", "recovered"]


def test_cancel_deletes_the_node(controller):
    job, st = _running(controller, gpu_spec("stopme"))
    controller.cancel(job)
    assert controller.sweep(job) == 200
    controller.wait_state(job, "CANCELLED")
    assert controller.live(job) == []


@pytest.mark.parametrize("field, broken", [
    ("zones", {"zones": []}),
    # Valid as a spec, but its nodes could not be created (composition.admit): 63 labels and Respawn's own two.
    ("labels", {"labels": {f"k{i}": "v" for i in range(63)}}),
])
def test_invalid_spec_is_recorded_with_the_field_and_alerted(controller, field, broken):
    job = controller.register({**gpu_spec("broken"), **broken})
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "INVALID")
    assert f"invalid job spec: {field}: " in st.message
    [alert] = controller.alerts(want=1)
    assert alert["type"] == "invalid_spec" and any(e.startswith(f"{field}: ") for e in alert["errors"])
    assert controller.sim.history() == []


def test_a_failure_past_max_failures_fails_the_job_and_deletes_the_node_and_a_preemption_never_does(controller):
    # max_restarts, the old name of max_failures: 0 failures allowed. A preemption is recovered all the same.
    job, st = _running(controller, gpu_spec("fragile", max_restarts=0, termination_action="DELETE"))
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.attempt, st.preemptions, st.failures) == (2, 1, 0)
    controller.heartbeat(st.node, state="exited", exit_code=1, output_tail="RuntimeError: CUDA error")
    assert controller.sweep(job) == 200
    after = controller.wait_state(job, "FAILED")
    assert "gave up after 1 failure, more than max_failures (0) (last cause: trainer_crashed)" in after.message
    assert after.failures == 1 and after.last_error == "RuntimeError: CUDA error"
    assert controller.sim.status_of(st.zone, st.node) is None
    [alert] = [a for a in controller.alerts(want=1) if a["type"] == "failed"]
    assert (alert["failures"], alert["preemptions"], alert["output_tail"]) == (1, 1, "RuntimeError: CUDA error")


def test_the_eventarc_bridges_full_document_event_is_understood(controller):
    # The exact CloudEvent sim/bridges.py (Eventarc, played locally) sends: every field of the created document.
    from sim.bridges import cloudevent_headers, document_event_data

    job = controller.register(gpu_spec("bridged"))
    snap = controller.db.collection("jobs").document(job).get()
    body = document_event_data(snap, controller.project)
    assert controller.deliver("on_job_created", cloudevent_headers(controller.project, f"jobs/{job}"), body) == 200
    assert controller.wait_state(job, "RUNNING").node == "bridged-1"


def test_host_error_event_replaces_the_node_and_records_the_cause(controller):
    job, st = _running(controller, gpu_spec("hosterr", termination_action="DELETE"))
    controller.sim.host_error(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    assert entry["protoPayload"]["methodName"] == "compute.instances.hostError"
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    # The platform took the node: told as every such loss is (recovery_time.loss_cause, the same cause whether the
    # audit log or a poll said it first), the audit log's word kept as the loss event's signal.
    assert (after.attempt, after.last_cause, after.restarts) == (2, "preempted", 1)
    [loss] = [e for e in controller.events(job) if e["details"].get("lost")]
    assert (loss["cause"], loss["details"]["signal"]) == ("preempted", "host_error")
    assert controller.sim.status_of(st.zone, st.node) is None and controller.sim.max_live(job) == 1


def test_a_one_node_status_stored_by_the_previous_version_is_migrated_on_first_touch(controller):
    """Before the one status shape, a one-node job's node fields were at the top level of its status (no members).
    Such a document is read as the job's one slot, and the next write stores the one shape."""
    job, st = _running(controller, gpu_spec("stored", termination_action="DELETE"))
    t = st.updated_at.isoformat()
    old = {  # what the previous version wrote for a RUNNING one-node job, field for field
        "state": "RUNNING", "message": f"running on {st.node} in {st.zone}", "attempt": 1, "node": st.node,
        "zone": st.zone, "provisioning": "spot", "restarts": 0, "failures": 0, "preemptions": 0, "failure_streak": 0,
        "boot_failures": 0, "console_tail": None, "preempted_times": [], "rate_exceeded_at": None,
        "consecutive_failures": 0, "last_committed_step": None, "total_steps": None, "zones_used": [st.zone],
        "preempted_zone": None, "preempted_at": None, "next_attempt_at": None, "updated_at": t, "revision": 3,
        "create_state": "created", "node_started_at": t, "tried_zones": [], "in_place_restarts": 0,
        "recovering": False, "last_cause": None, "last_step": None, "steps_lost": None, "exit_code": None,
        "members": [], "generation": None, "moving": False, "address": None, "generation_sent": 0,
    }
    controller.db.collection("jobs").document(job).update({"status": old})
    controller.heartbeat(st.node, step=40, committed_step=30)
    assert controller.sweep(job) == 200  # its first touch: progress recorded, in the one shape
    stored = controller.db.collection("jobs").document(job).get().to_dict()["status"]
    assert [(m["node"], m["zone"], m["create_state"]) for m in stored["members"]] == [(st.node, st.zone, "created")]
    assert not {"create_state", "node_started_at", "address", "generation_sent"} & stored.keys()
    assert (stored["last_step"], stored["last_committed_step"]) == (40, 30)
    # And it recovers as any job: the node's loss is seen on the migrated slot.
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.node, after.attempt, after.preemptions, after.last_cause) == (f"{job}-2", 2, 1, "preempted")
    assert [m.node for m in after.members] == [f"{job}-2"]
