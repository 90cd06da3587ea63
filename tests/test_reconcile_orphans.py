"""functions/orphans.py (pure) and the sweep's orphan scan through on_sweep."""

from __future__ import annotations

from google.cloud import compute_v1

from respawn.control.orphans import Seen, orphans
from functions_fixtures import ZONES, controller, gpu_spec  # noqa: F401
from sim_fixtures import compute_clients, compute_result, sim_factory, sim_server  # noqa: F401


def seen(name, zone="z-a", job=None, attempt=None, kind="gpu"):
    labels = {}
    if job is not None:
        labels["respawn-job"] = job
    if attempt is not None:
        labels["respawn-attempt"] = attempt
    return Seen(kind, zone, name, labels)


JOBS = {"a": {"state": "RUNNING", "node": "a-3", "zone": "z-a"}, "done": {"state": "SUCCEEDED", "node": "done-1", "zone": "z-a"}}


def test_orphans_table():
    rows = [
        (seen("a-3", job="a", attempt="3"), False),  # the current node
        (seen("a-2", job="a", attempt="2"), True),  # an older attempt
        (seen("a-3", zone="z-b", job="a", attempt="3"), True),  # same name, another zone (a late create)
        (seen("done-1", job="done", attempt="1"), True),  # a finished job's node
        (seen("gone-4", job="gone", attempt="4"), True),  # its job document was deleted
        (seen("web-1"), False),  # not labelled
        (seen("x-1", job="a", attempt="1"), False),  # labels that do not match the name: hand-made, left alone
        (seen("a-0", job="a", attempt="0"), False),
        (seen("a-x", job="a", attempt="x"), False),
    ]
    found = orphans([n for n, _ in rows], JOBS)
    assert [n for n, orphan in rows if orphan] == found


def test_sweep_deletes_a_stray_node_of_a_job_and_keeps_the_current_one(controller):
    job = controller.register(gpu_spec("tidy"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    instances, ops = compute_clients(controller.sim.endpoint)
    stray = compute_v1.Instance(name="tidy-9", machine_type=f"zones/{ZONES[1]}/machineTypes/n1-standard-8",
                                labels={"respawn-job": "tidy", "respawn-attempt": "9"})
    foreign = compute_v1.Instance(name="web-1", machine_type=f"zones/{ZONES[1]}/machineTypes/n1-standard-8")
    for body in (stray, foreign):
        compute_result(ops, controller.project, ZONES[1],
                       instances.insert_unary(project=controller.project, zone=ZONES[1], instance_resource=body))
    assert controller.sweep() == 200
    assert controller.sim.status_of(ZONES[1], "tidy-9") is None
    assert controller.sim.status_of(ZONES[1], "web-1") == "RUNNING"
    assert controller.sim.status_of(st.zone, st.node) == "RUNNING"


def test_a_zone_whose_listing_fails_does_not_stop_the_scan_of_the_others(controller):
    job = controller.register(gpu_spec("tidy"))
    assert controller.job_created(job) == 200
    controller.wait_state(job, "RUNNING")
    instances, ops = compute_clients(controller.sim.endpoint)
    strays = {zone: f"tidy-{9 + i}" for i, zone in enumerate(ZONES[:2])}
    for zone, name in strays.items():
        body = compute_v1.Instance(name=name, machine_type=f"zones/{zone}/machineTypes/n1-standard-8",
                                   labels={"respawn-job": "tidy", "respawn-attempt": name.rsplit("-", 1)[1]})
        compute_result(ops, controller.project, zone,
                       instances.insert_unary(project=controller.project, zone=zone, instance_resource=body))
    # The scan lists the zones in order: the first one's listing fails, the second is still scanned.
    controller.sim.set_api_faults(count=1, status=500, methods=("list",))
    assert controller.sweep() == 200
    assert controller.sim.status_of(ZONES[0], strays[ZONES[0]]) == "RUNNING", "nothing is deleted unseen"
    assert controller.sim.status_of(ZONES[1], strays[ZONES[1]]) is None
