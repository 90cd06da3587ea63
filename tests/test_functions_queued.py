"""TPU queued resources through the entry points (issue #26 item 2): Functions Framework, real CloudEvents, the
Firestore/Pub/Sub emulators, and sim/'s queued resources through the real google-cloud-tpu client (tpu_v2, REST).
Every test ends with no request the job does not name, never more than one at a time, and never two live nodes.
A preemption event delivered three times at once: tests/test_functions_guarantees.py's matrix (tpu-queued)."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2

from functions_fixtures import ZONES, controller, tpu_spec  # noqa: F401
from sim_fixtures import PROJECT, sim_factory  # noqa: F401

SLICE = "v4-16"  # 2 hosts: a queued resource by default


@pytest.fixture
def sim_server(sim_factory):
    # A queued resource's wait (queue_wait_minutes, at least 1 min) passes 100 times faster on the sim's side.
    return sim_factory(run_duration_scale=0.01)


def queued_spec(job_id: str, wait_minutes: float = 1, **over):
    return tpu_spec(job_id, accelerator={"kind": "tpu", "accelerator_type": SLICE,
                                         "runtime_version": "tpu-ubuntu2204-base", "queue_wait_minutes": wait_minutes},
                    **over)


def requests(controller, job: str) -> list[dict]:
    return controller.sim.queued_resources(job)


def settled(controller, job: str, node: str, zone: str) -> None:
    """The job's one request is its current node's, and no more than one request or live node ever existed."""
    assert [(q["zone"], q["name"]) for q in requests(controller, job)] == [(zone, node)]
    assert controller.sim.max_requests(job) == 1 and controller.sim.max_live(job) <= 1


def running(controller, spec):
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    return job, controller.wait_state(job, "RUNNING")


def test_a_preempted_spot_request_is_deleted_and_requested_again(controller):
    # One slice of Spot quota in the region of every zone: the SUSPENDED request holds it until it is deleted.
    controller.sim.set_quota("us-central1", SLICE, 1, provisioning_model="SPOT")
    job, st = running(controller, queued_spec("qspot"))
    assert requests(controller, job)[0]["state"] == "ACTIVE"
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)  # tpu.nodes.terminate: the request goes SUSPENDED
    controller.sim.wait_for(lambda: requests(controller, job)[0]["state"] == "SUSPENDED", 20, "SUSPENDED")
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.attempt, after.preemptions, after.failures) == (2, 1, 0)
    settled(controller, job, after.node, after.zone)
    assert [q["state"] for q in requests(controller, job)] == ["ACTIVE"]
    # Each request lived, and was deleted, before the next: the SUSPENDED one held quota until then.
    first, second = controller.sim.request_history()
    assert first["deletedAt"] <= second["createdAt"]


def test_a_request_no_capacity_serves_fails_its_wait_and_the_next_zone_is_asked(controller):
    controller.sim.set_capacity(ZONES[0], SLICE, 0)
    job = controller.register(queued_spec("qwait"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.zone, st.attempt, st.preemptions, st.failures) == (ZONES[1], 2, 0, 0)
    settled(controller, job, st.node, st.zone)
    first = controller.sim.request_history()[0]
    assert (first["zone"], [s for _, s in first["states"]][-3:]) == (ZONES[0], ["FAILED", "DELETING", "DELETED"])
    assert any(e["cause"] == "zone_refused_queued" for e in controller.events(job))


def test_a_cancelled_job_deletes_its_waiting_request(controller, monkeypatch):
    monkeypatch.setenv("RESPAWN_POLL_BUDGET_SECONDS", "1")  # the waiting request is left to the sweep at once
    for zone in ZONES:
        controller.sim.set_capacity(zone, SLICE, 0)
    job = controller.register(queued_spec("qcancel", wait_minutes=60))
    assert controller.job_created(job) == 200
    controller.sim.wait_for(lambda: [q["state"] for q in requests(controller, job)] == ["WAITING_FOR_RESOURCES"], 20,
                            "the request waiting")
    controller.cancel(job)
    assert controller.sweep(job) == 200
    controller.wait_state(job, "CANCELLED")
    assert requests(controller, job) == [] and controller.sim.live_nodes(job) == []


def test_a_request_that_turns_active_after_its_job_moved_on_is_deleted_by_the_sweep(controller):
    # marin #4724: a request its client gave up on was filled an hour later. Here one of an earlier attempt (its
    # delete lost with the function that made it) is filled while the job runs on attempt 1.
    from respawn.control.adapters.tpu import QueuedTpuProvider
    from respawn.control import clients
    from respawn.schema import parse_spec

    job, st = running(controller, queued_spec("qlate"))
    made = clients.Clients(clients.Endpoints(PROJECT, controller.sim.endpoint, controller.sim.endpoint))
    QueuedTpuProvider(made).create(parse_spec(queued_spec("qlate")), ZONES[2], "qlate-7", 7, "spot", "#!/bin/bash\n")
    controller.sim.wait_for(lambda: {q["name"]: q["state"] for q in requests(controller, job)}.get("qlate-7")
                            == "ACTIVE", 20, "the late request ACTIVE")
    assert controller.sweep() == 200
    assert [(q["zone"], q["name"]) for q in requests(controller, job)] == [(st.zone, st.node)]
    assert controller.sim.status_of(ZONES[2], "qlate-7") is None
    assert controller.sim.status_of(st.zone, st.node) == "READY"


@pytest.mark.parametrize("after_the_call", [False, True], ids=["before-the-call", "after-the-call"])
def test_a_crash_at_the_requests_create_is_retried_without_a_second_request(controller, after_the_call):
    # The function dies once at its create of the request: before the call reached Cloud TPU, or after Cloud TPU
    # carried it out (the reply lost: the retried create meets 409 and adopts the request).
    job = controller.register(queued_spec("qcrash"))
    controller.sim.set_api_faults(count=1, methods=("create",), nodes=("qcrash-1",), after=after_the_call)
    assert controller.job_created(job) == 500  # the platform redelivers
    assert controller.status(job).members[0].create_state == "pending"  # recorded, never confirmed
    assert len(controller.sim.request_history()) == int(after_the_call)
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.attempt, st.node) == (1, "qcrash-1")
    settled(controller, job, st.node, st.zone)


@pytest.mark.parametrize("status", [429, 503])
def test_a_refused_delete_of_a_suspended_request_is_retried_by_the_redelivery(controller, status):
    job, st = running(controller, queued_spec(f"qdel{status}"))
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    controller.sim.wait_for(lambda: requests(controller, job)[0]["state"] == "SUSPENDED", 20, "SUSPENDED")
    controller.sim.set_api_faults(count=1, status=status, methods=("delete",), nodes=(st.node,))
    assert controller.log_event(entry) == 500  # transient: raised, so the platform redelivers
    assert controller.status(job).state.value == "PREEMPTED"  # recorded before the delete
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert after.attempt == 2
    settled(controller, job, after.node, after.zone)


def test_a_dropped_preemption_event_is_recovered_by_the_sweep(controller):
    job, st = running(controller, queued_spec("qdrop"))
    controller.sim.preempt(st.zone, st.node)
    controller.wait_system_event(st.node)  # never delivered
    controller.sim.wait_for(lambda: requests(controller, job)[0]["state"] == "SUSPENDED", 20, "SUSPENDED")
    assert controller.sweep() == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.attempt, after.preemptions) == (2, 1)
    settled(controller, job, after.node, after.zone)
    assert requests(controller, job)[0]["state"] == tpu_v2.QueuedResourceState.State.ACTIVE.name


def test_a_single_host_through_a_request_is_asked_again_in_the_next_zone_and_none_is_left_at_the_end(controller):
    """A single-host Spot TPU VM through a queued resource (what the tpu-queued demo scenario showed, moved down from
    tests/test_demo_scenarios.py): its preemption's SUSPENDED request is deleted and a new one asked in the next zone,
    one request at a time; the job succeeds and no request is left."""
    job, st = running(controller, tpu_spec("qone", accelerator={
        "kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite",
        "queued_resource": True, "queue_wait_minutes": 10}, zones=ZONES[:2]))
    assert st.zone == ZONES[0] and requests(controller, job)[0]["state"] == "ACTIVE"
    controller.heartbeat(st.node, step=100, committed_step=100)
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    assert controller.log_event(entry) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.zone, after.attempt, after.preemptions, after.failures) == (ZONES[1], 2, 1, 0)
    settled(controller, job, after.node, after.zone)
    controller.heartbeat(after.node, state="exited", exit_code=0, step=300, committed_step=300)
    assert controller.sweep() == 200
    done = controller.wait_state(job, "SUCCEEDED")
    assert done.last_committed_step == 300
    controller.sim.wait_for(lambda: requests(controller, job) == [] and controller.live(job) == [], 30,
                            "no request or node of the job left")
    assert controller.sim.max_requests(job) == 1 and controller.sim.max_live(job) <= 1
    assert [q["zone"] for q in controller.sim.request_history()] == ZONES[:2]
