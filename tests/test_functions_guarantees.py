"""The recovery guarantees, each proven through the entry points (Functions Framework, real CloudEvents,
Firestore/Pub/Sub emulators, sim/ through the real Compute and TPU clients)."""

from __future__ import annotations

import time

import pytest

from functions_fixtures import ZONES, controller, gpu_spec, tpu_spec  # noqa: F401
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def _running(controller, spec):
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    return job, controller.wait_state(job, "RUNNING")


def test_job_created_delivered_three_times_concurrently_makes_one_node(controller):
    job = controller.register(gpu_spec("triple"))
    codes = controller.concurrently([lambda: controller.job_created(job)] * 3)
    assert codes == [200, 200, 200]
    st = controller.wait_state(job, "RUNNING")
    assert st.attempt == 1
    assert controller.sim.max_live("triple") == 1 and len(controller.sim.history()) == 1


@pytest.mark.parametrize("spec", [gpu_spec("gpudup", termination_action="DELETE"), gpu_spec("stopdup"), tpu_spec("tpudup"),
                                  tpu_spec("tpuqdup", accelerator={"kind": "tpu", "accelerator_type": "v5litepod-8",
                                                                   "runtime_version": "v2-alpha-tpuv5-lite",
                                                                   "queued_resource": True})],
                         ids=["gpu-delete", "gpu-stop", "tpu", "tpu-queued"])
def test_preemption_event_delivered_three_times_concurrently_recovers_once(controller, spec):
    job, st = _running(controller, spec)
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    codes = controller.concurrently([lambda: controller.log_event(entry)] * 3)
    assert codes == [200, 200, 200]
    after = controller.wait_state(job, "RUNNING")
    assert after.restarts == 1
    assert len(controller.live(job)) == 1 and controller.sim.max_live(job) == 1
    # A queued resource (issue #26 item 2): one request at a time, and the one left is the current node's.
    assert controller.sim.max_requests(job) <= 1
    assert [q["name"] for q in controller.sim.queued_resources(job)] in ([], [after.node])
    # A late duplicate, after recovery, finds nothing to do.
    assert controller.log_event(entry) == 200
    assert controller.status(job).revision == after.revision
    controller.heartbeat(after.node)  # the replacement's agent reports: the recovery, told once
    assert controller.sweep(job) == 200
    assert [a["type"] for a in controller.alerts(want=1)] == ["recovered"]


def _crash_once(controller, node: str, *, after_the_call: bool) -> None:
    """The function dies once at its create of `node`: before the call reached Compute Engine, or after Compute
    Engine carried it out (the reply lost). Injected in the dependency (the sim's API), not in the function."""
    controller.sim.set_api_faults(count=1, methods=("insert",), nodes=(node,), after=after_the_call)


def test_crash_between_record_and_create_is_retried_without_harm(controller):
    job = controller.register(gpu_spec("crash1"))
    _crash_once(controller, "crash1-1", after_the_call=False)
    assert controller.job_created(job) == 500  # the platform sees a failure and redelivers
    st = controller.status(job)
    assert (st.state.value, st.attempt, st.members[0].create_state) == ("PROVISIONING", 1, "pending")
    assert controller.sim.history() == []  # recorded, not acted
    assert controller.job_created(job) == 200  # the redelivery
    st = controller.wait_state(job, "RUNNING")
    assert (st.attempt, st.node) == (1, "crash1-1") and len(controller.sim.history()) == 1


def test_crash_after_create_meets_409_on_retry_and_adopts_the_node(controller):
    job = controller.register(gpu_spec("crash2"))
    _crash_once(controller, "crash2-1", after_the_call=True)
    assert controller.job_created(job) == 500
    assert controller.status(job).members[0].create_state == "pending"  # the outcome was never recorded
    assert [n["name"] for n in controller.live(job)] == ["crash2-1"]
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.attempt, st.node, st.members[0].create_state) == (1, "crash2-1", "created")
    assert len(controller.sim.history()) == 1 and controller.sim.max_live(job) == 1


def test_crash_after_create_then_sweep_adopts_via_409_as_well(controller):
    # The retried create is what meets 409: make the node exist but the status still say "pending".
    job = controller.register(gpu_spec("crash3"))
    _crash_once(controller, "crash3-1", after_the_call=True)
    assert controller.job_created(job) == 500
    assert controller.sweep() == 200
    st = controller.wait_state(job, "RUNNING")
    assert st.attempt == 1 and len(controller.sim.history()) == 1


def test_lost_preemption_event_is_recovered_by_the_sweep(controller):
    job, st = _running(controller, gpu_spec("lost", termination_action="DELETE"))
    controller.sim.preempt(st.zone, st.node)
    controller.wait_system_event(st.node)  # the event happened; it is never delivered
    assert controller.sweep() == 200  # one sweep period later
    after = controller.wait_state(job, "RUNNING")
    assert (after.attempt, after.restarts, after.zone) == (2, 1, ZONES[1])
    assert controller.sim.max_live(job) == 1


def test_stale_heartbeat_is_recovered_by_the_sweep_after_the_threshold(controller):
    job, st = _running(controller, gpu_spec("silent"))
    controller.heartbeat(st.node, step=10, committed_step=10)
    assert controller.sweep() == 200
    assert controller.status(job).attempt == 1  # fresh: nothing to do
    # The agent dies (or the VM hangs): no heartbeat for longer than the threshold (5 s in the tests), on the
    # control plane's clock moved 6 s on rather than waited out.
    controller.advance(6)
    assert controller.sweep() == 200
    deadline = time.monotonic() + 30
    while (after := controller.status(job)).state.value != "RUNNING":  # a failure: the backoff (1 s) first
        assert time.monotonic() < deadline, after
        assert controller.sweep(job) == 200
        time.sleep(0.2)
    assert (after.attempt, after.restarts, after.last_cause) == (2, 1, "stale_heartbeat")
    assert (after.failures, after.preemptions) == (1, 0)
    assert controller.sim.status_of(st.zone, st.node) is None and controller.sim.max_live(job) == 1


@pytest.mark.parametrize(
    "entry,raw",
    [
        (None, b"not json at all"),
        ({"protoPayload": {"methodName": "compute.instances.preempted"}}, None),
        ({"protoPayload": {"methodName": "compute.instances.insert", "resourceName": "projects/p/zones/us-central1-a/instances/x-1"}}, None),
        ({"protoPayload": {"methodName": "compute.instances.preempted",
                           "resourceName": "projects/p/zones/us-central1-a/instances/web-server"}}, None),
        ({"protoPayload": {"methodName": "compute.instances.preempted",
                           "resourceName": "projects/p/zones/us-central1-a/instances/nobody-7"}}, None),
        ({"protoPayload": {"methodName": "compute.instances.preempted",
                           "resourceName": "projects/p/zones/us-central1-a/instances/t1v-n-0a1b2c3d-w-0"}}, None),
    ],
    ids=["not-json", "no-resource", "not-a-loss", "foreign-name", "no-such-job", "tpu-worker-no-job"],
)
def test_malformed_and_unowned_events_are_acknowledged(controller, entry, raw):
    assert controller.log_event(entry, raw=raw) == 200


def test_tpu_worker_vm_event_finds_its_job_with_one_lookup(controller):
    job, st = _running(controller, tpu_spec("worker"))
    controller.sim.preempt(st.zone, st.node)
    controller.sim.wait_for(lambda: controller.sim.status_of(st.zone, st.node) == "PREEMPTED", what="TPU preempted")
    worker = {"protoPayload": {"methodName": "compute.instances.preempted",
                               "resourceName": f"projects/{controller.project}/zones/{st.zone}/instances/t1v-n-5e0f11aa-w-0"},
              "resource": {"type": "gce_instance", "labels": {"zone": st.zone}}}
    assert controller.log_event(worker) == 200
    after = controller.wait_state(job, "RUNNING")
    assert after.attempt == 2 and controller.sim.status_of(st.zone, st.node) is None


def test_malformed_triggers_are_acknowledged(controller):
    assert controller.job_created("ghost") == 200  # a created event for a job that is gone
    assert controller.job_created("x", data=b"\xff\xfenot-protobuf") == 200
    assert controller.sweep() == 200  # nothing to sweep
    assert controller.deliver("on_sweep", *__import__("functions_fixtures").pubsub_event({"task": "dance"})) == 200
    assert controller.alert({"no": "type"}) == 200


def test_crash_between_recording_a_restart_in_place_and_starting_it(controller):
    # The redelivery sees the restart recorded but the node still TERMINATED: it starts it again. Counting that as a
    # second loss would delete the node another delivery may be starting and bill a restart that never happened.
    job, st = _running(controller, gpu_spec("crash4"))
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    controller.sim.set_api_faults(count=1, methods=("start",), nodes=(st.node,))  # dies as it starts the node
    assert controller.log_event(entry) == 500
    mid = controller.status(job)
    assert (mid.state.value, mid.members[0].create_state, mid.restarts) == ("PROVISIONING", "starting", 1)
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.restarts, after.node, after.attempt, after.members[0].create_state) == (1, st.node, st.attempt, "created")
    assert [r["name"] for r in controller.sim.history()] == [st.node] and controller.sim.max_live(job) == 1
