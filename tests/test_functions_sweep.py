"""The sweep fans out: Cloud Scheduler's tick lists the active jobs and publishes one message per job to the sweep
topic, and each comes back to on_sweep as an invocation of its own (tests/functions_fixtures.py's relay plays the
push subscription). Through the real entry points, the Pub/Sub and Firestore emulators and the sim."""

from __future__ import annotations

import json
import threading

from functions_fixtures import ZONES, controller, gpu_spec, pubsub_event  # noqa: F401
from respawn.schema import State
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def _in_background(call) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def test_a_job_whose_create_hangs_does_not_hold_back_the_sweep_of_another(controller):
    # "a-slow" is listed first: a sweep that reconciled the jobs one after another would wait on it before "b-quick".
    slow = controller.register(gpu_spec("a-slow", zones=[ZONES[0]]))
    quick = controller.register(gpu_spec("b-quick", zones=[ZONES[1]]))
    controller.sim.hold_operations(ZONES[0])  # a-slow's create stays pending until released, as a slow one does
    sweep, result = _in_background(controller.sweep)
    try:
        controller.wait_state(quick, "RUNNING", timeout=60)
        # ...while a-slow's reconcile still waits on its create: its node is PROVISIONING, the sweep not over.
        st = controller.status(slow)
        assert (st.state, st.node) == (State.PROVISIONING, "a-slow-1")
        assert controller.sim.status_of(ZONES[0], "a-slow-1") == "PROVISIONING"
        assert sweep.is_alive()
    finally:
        controller.sim.release_operations(ZONES[0])
    sweep.join(120)
    assert result == [200]
    assert controller.status(slow).state is State.RUNNING


def test_the_tick_publishes_one_message_per_active_job_and_reconciles_none_itself(controller):
    running = controller.register(gpu_spec("run"))
    assert controller.job_created(running) == 200
    controller.wait_state(running, "RUNNING")
    waiting = controller.register(gpu_spec("wait"))
    done = controller.register(gpu_spec("done"))
    controller.cancel(done)
    assert controller.sweep(done) == 200  # the CLI's nudge: reconciled at once
    controller.wait_state(done, "CANCELLED")

    assert controller.deliver("on_sweep", *pubsub_event({"task": "sweep"})) == 200
    bodies = sorted((json.loads(m) for m in controller.sweep_relay.pull()), key=lambda b: b["job_id"])
    assert [(b["task"], b["job_id"]) for b in bodies] == [("sweep", "run"), ("sweep", "wait")]  # not the ended one
    assert bodies[0]["swept_at"] == bodies[1]["swept_at"]  # one tick
    assert controller.status(waiting).state is State.PENDING  # the tick itself reconciled nothing
    for body in bodies:
        assert controller.deliver("on_sweep", *pubsub_event(body)) == 200
    assert controller.wait_state(waiting, "RUNNING").node == "wait-1"


def test_one_jobs_failure_is_logged_and_acknowledged_and_the_others_are_reconciled(controller, capsys):
    bad, good = controller.register(gpu_spec("bad")), controller.register(gpu_spec("good"))

    controller.sim.set_api_faults(count=1, methods=("insert",), nodes=("bad-1",))  # its reconcile dies at the create
    assert controller.sweep() == 200  # the fanned-out message of "bad" is acknowledged: the next tick sends it again
    assert controller.status(good).state is State.RUNNING
    assert "sweep: reconciling bad failed, the next sweep tries again" in capsys.readouterr().out
    assert controller.sweep() == 200
    assert controller.status(bad).state is State.RUNNING


def test_a_tick_that_cannot_publish_says_what_to_check_and_still_scans_for_orphans(controller, monkeypatch, capsys):
    from google.cloud import compute_v1

    from sim_fixtures import compute_clients, compute_result

    job = controller.register(gpu_spec("tidy"))
    instances, ops = compute_clients(controller.sim.endpoint)
    stray = compute_v1.Instance(name="tidy-9", machine_type=f"zones/{ZONES[1]}/machineTypes/n1-standard-8",
                                labels={"respawn-job": "tidy", "respawn-attempt": "9"})
    compute_result(ops, controller.project, ZONES[1],
                   instances.insert_unary(project=controller.project, zone=ZONES[1], instance_resource=stray))
    monkeypatch.setenv("RESPAWN_SWEEP_TOPIC", "no-such-topic")
    assert controller.deliver("on_sweep", *pubsub_event({"task": "sweep"})) == 200
    out = capsys.readouterr().out
    line = next(json.loads(l) for l in out.splitlines() if "not sent to no-such-topic" in l)
    assert line["severity"] == "ERROR" and line["jobs"] == [job]
    assert "the next sweep sends them again" in line["message"] and "RESPAWN_SWEEP_TOPIC" in line["message"]
    assert controller.sim.status_of(ZONES[1], "tidy-9") is None  # the orphan scan ran all the same
