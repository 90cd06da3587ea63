"""Acting on the notice (issue #25) through the entry points: the node agent's notice message reaches on_sweep, the
controller creates the replacement while the noticed VM still runs, and the audit event that follows finds the work
done. The sim writes the preempted audit entry at the notice's start (the earliest Google could; gcp-facts §17 leaves
when open), the worst case for a double create; the VMs ask for a 120 s notice, so the noticed VM runs on through
each test (the sim serves scheduling.preemptionNoticeDuration)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from functions_fixtures import ZONES, controller, gpu_spec, tpu_spec  # noqa: F401
from sim_fixtures import sim_factory  # noqa: F401


@pytest.fixture
def sim_server(sim_factory):
    return sim_factory(audit_timing="start")


def _running(controller, spec):
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    return job, controller.wait_state(job, "RUNNING")


def _created(controller, job):
    return sorted(r["name"] for r in controller.sim.history() if r["labels"].get("respawn-job") == job)


def test_a_notice_creates_the_replacement_before_the_audit_event_which_then_changes_nothing(controller):
    job, st = _running(controller, gpu_spec("early", termination_action="DELETE", notice_seconds=120))
    scheduling = controller.sim.compute.instances[(st.zone, st.node)].body["scheduling"]  # as Compute stored it
    assert scheduling["preemptionNoticeDuration"] == {"seconds": "120"}
    controller.heartbeat(st.node, step=100, committed_step=96)
    controller.sim.preempt(st.zone, st.node)  # instance/preempted TRUE; the soft-off comes 120 s later
    noticed_at = datetime.now(timezone.utc)
    assert controller.notice(job, st.node) == 200
    after = controller.status(job)
    assert (after.node, after.zone, after.attempt, after.preemptions, after.restarts) == ("early-2", ZONES[1], 2, 1, 1)
    leaving = after.members[0].leaving
    assert (leaving.node, leaving.zone) == (st.node, st.zone)
    assert timedelta(seconds=145) < leaving.until - noticed_at < timedelta(seconds=155)
    nodes = {n["name"]: n for n in controller.live(job)}
    assert nodes[st.node]["status"] == "RUNNING"  # still saving its emergency checkpoint
    handover = json.loads(nodes["early-2"]["attributes"]["respawn-handover"])
    assert handover == {"node": st.node, "until": leaving.until.isoformat()}
    [event] = [e for e in controller.events(job) if e.get("details", {}).get("during_notice")]
    assert (event["from_state"], event["to_state"], event["cause"]) == ("RUNNING", "PROVISIONING", "preempted")

    # The audit event follows (twice): the slot's node is early-2 now, so it changes nothing.
    entry = controller.wait_system_event(st.node)
    assert controller.concurrently([lambda: controller.log_event(entry)] * 2) == [200, 200]
    st2 = controller.status(job)
    assert (st2.node, st2.attempt, st2.preemptions, st2.restarts) == ("early-2", 2, 1, 1)
    assert _created(controller, job) == ["early-1", "early-2"]
    # The orphan scan leaves the saving node alone.
    assert controller.sweep() == 200
    assert st.node in {n["name"] for n in controller.live(job)}


def test_a_tpu_node_replaced_during_its_notice_is_deleted_by_the_pass_that_sees_it_preempted(controller):
    """Issue #34: the preempted TPU node (it holds quota until deleted) stayed until the orphan scan deleted it. The
    job's next reconcile after the API shows it PREEMPTED deletes it, well within its notice window."""
    job, st = _running(controller, tpu_spec("tpunote"))
    controller.heartbeat(st.node, step=100, committed_step=96)
    # The notice comes first: on Google Cloud the node stays READY through its notice, but the sim's node has no
    # guest to shut down and goes PREEMPTED at once, so a notice sent after sim.preempt raced that (CI, 2026-11-28).
    assert controller.notice(job, st.node) == 200
    [event] = [e for e in controller.events(job) if e.get("details", {}).get("during_notice")]
    assert event["details"]["leaving"] == st.node and controller.status(job).node == "tpunote-2"
    until = datetime.fromisoformat(json.loads(controller.live(job)[-1]["attributes"]["respawn-handover"])["until"])
    controller.sim.preempt(st.zone, st.node)
    controller.sim.wait_for(lambda: controller.sim.status_of(st.zone, st.node) in ("PREEMPTED", None), timeout=20,
                            what=f"{st.node} preempted")
    assert controller.sweep(job) == 200  # the job's own reconcile: no tick, no orphan scan
    assert datetime.now(timezone.utc) < until  # well within its window, which is when it used to go
    assert controller.sim.status_of(st.zone, st.node) is None
    assert controller.status(job).members[0].leaving is None
    assert [n["name"] for n in controller.live(job)] == ["tpunote-2"]


def test_a_notice_and_its_audit_event_delivered_together_and_twice_create_one_replacement(controller):
    job, st = _running(controller, gpu_spec("race", termination_action="DELETE", notice_seconds=120))
    controller.sim.preempt(st.zone, st.node)
    entry = controller.wait_system_event(st.node)
    codes = controller.concurrently([lambda: controller.notice(job, st.node), lambda: controller.notice(job, st.node),
                                     lambda: controller.log_event(entry), lambda: controller.log_event(entry)])
    assert codes == [200, 200, 200, 200]
    after = controller.status(job)
    assert (after.node, after.attempt, after.preemptions) == ("race-2", 2, 1)
    assert _created(controller, job) == ["race-1", "race-2"]


def test_a_create_whose_answer_is_lost_during_the_notice_is_adopted_by_the_audit_event(controller):
    job, st = _running(controller, gpu_spec("lost", termination_action="DELETE", notice_seconds=120))
    controller.sim.preempt(st.zone, st.node)
    controller.sim.set_api_faults(count=1, methods=("insert",), nodes=("lost-2",), after=True)
    assert controller.notice(job, st.node) == 500  # the VM was made, its answer lost: the platform redelivers
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.node, after.attempt, after.members[0].create_state) == ("lost-2", 2, "created")
    assert _created(controller, job) == ["lost-1", "lost-2"]


def test_with_the_default_notice_a_stop_spot_vm_is_restarted_in_place_not_replaced(controller):
    job, st = _running(controller, gpu_spec("stay"))
    assert controller.notice(job, st.node) == 200  # before the preemption's stop: nothing to gain from a fresh VM
    assert controller.status(job).node == st.node and _created(controller, job) == ["stay-1"]
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    after = controller.wait_state(job, "RUNNING")
    assert (after.node, after.members[0].in_place_restarts, after.members[0].leaving) == (st.node, 1, None)
    assert _created(controller, job) == ["stay-1"]


def test_a_malformed_notice_is_logged_and_the_job_reconciled_as_usual(controller, capsys):
    job, st = _running(controller, gpu_spec("odd", termination_action="DELETE"))
    from functions_fixtures import pubsub_event

    body = {"task": "sweep", "job_id": job, "notice": {"node": st.node, "at": "yesterday"}}
    assert controller.deliver("on_sweep", *pubsub_event(body)) == 200
    assert controller.status(job).node == st.node
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "malformed" in x]
    assert line["severity"] == "WARNING" and line["message"].startswith("sweep: the notice of job odd is malformed")
