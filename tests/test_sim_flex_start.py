"""sim/'s flex-start VMs (docs/gcp-facts.md §18) through the real google-cloud-compute client: the wait for
capacity (PENDING, not live), the request's expiry, the run's end with its termination action, the fields Compute
refuses, and the preemptible quota."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from sim.core import SimError
from sim_fixtures import PROJECT, compute_clients, compute_result, sim_factory  # noqa: F401

ZONE = "us-central1-a"
REGION = "us-central1"
G2 = "g2-standard-8"  # one L4 built in: flex-start runs accelerator-optimized machine types (gcp-facts §18)
SCALE = 0.002  # wall seconds per run or wait second: a 600 s run lasts 1.2 s
SLOW = 0.01  # for a wait that must outlast a few calls: 90 s last 0.9 s


def flex_instance(name: str, *, run_s: int | None = 600, wait_s: int | None = 7200, action: str | None = "DELETE",
                  **scheduling) -> compute_v1.Instance:
    """A flex-start VM as functions/adapters/compute.py builds one (the fields of gcp-facts §18)."""
    sched = compute_v1.Scheduling(provisioning_model="FLEX_START", on_host_maintenance="TERMINATE",
                                  automatic_restart=False, **scheduling)
    if run_s is not None:
        sched.max_run_duration = compute_v1.Duration(seconds=run_s)
    if action is not None:
        sched.instance_termination_action = action
    inst = compute_v1.Instance(
        name=name, machine_type=f"zones/{ZONE}/machineTypes/{G2}", scheduling=sched,
        reservation_affinity=compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION"),
        labels={"respawn-job": "job-a"})
    if wait_s is not None:
        inst.params = compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=wait_s))
    return inst


def on_machine(inst: compute_v1.Instance, machine_type: str, gpu: str | None = None) -> compute_v1.Instance:
    inst.machine_type = f"zones/{ZONE}/machineTypes/{machine_type}"
    if gpu is not None:
        inst.guest_accelerators = [compute_v1.AcceleratorConfig(
            accelerator_type=f"projects/{PROJECT}/zones/{ZONE}/acceleratorTypes/{gpu}", accelerator_count=1)]
    return inst


def spot_instance(name: str) -> compute_v1.Instance:
    inst = flex_instance(name, run_s=None, wait_s=None, action="STOP")
    inst.scheduling.provisioning_model = "SPOT"
    return inst


def insert_op(instances, inst):
    return instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=inst)


def instant(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def states(sim, name: str) -> list[str]:
    return [s for _, s in next(r for r in sim.history() if r["name"] == name)["states"]]


def test_flex_start_runs_on_its_own_capacity_and_reports_its_run_end(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    sim.set_capacity(ZONE, G2, 0, provisioning_model="SPOT")  # Spot stocked out, flex-start not
    instances, ops = compute_clients(sim.endpoint)
    with pytest.raises(exceptions.ServiceUnavailable):
        compute_result(ops, PROJECT, ZONE, insert_op(instances, spot_instance("spot-1")))
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1", run_s=3600)))
    got = instances.get(project=PROJECT, zone=ZONE, instance="flex-1")
    assert got.status == "RUNNING"
    assert got.scheduling.provisioning_model == "FLEX_START"
    assert got.scheduling.max_run_duration.seconds == 3600
    assert got.scheduling.instance_termination_action == "DELETE"
    assert got.params.request_valid_for_duration.seconds == 7200
    # The run's end, in the sim's compressed time: the start + 3600 s × SCALE (7.2 s).
    end = instant(got.resource_status.scheduling.termination_timestamp)
    assert end - instant(got.last_start_timestamp) == pytest.approx(3600 * SCALE, abs=0.1)
    assert states(sim, "flex-1") == ["PROVISIONING", "STAGING", "RUNNING"]
    assert sim.history()[-1]["provisioningModel"] == "FLEX_START"


def passes_after(sim, n: int) -> None:
    """Wait until the sim has passed over its flex-start queue `n` more times (what a sleep stood for)."""
    compute = sim.compute
    first = compute.queue_passes
    sim.wait_for(lambda: compute.queue_passes >= first + n, timeout=10, what=f"{n} passes over the queue")


def test_no_capacity_waits_pending_not_live_until_capacity_comes_first_asked_first(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    sim.set_capacity(ZONE, G2, 0, provisioning_model="FLEX_START")
    instances, ops = compute_clients(sim.endpoint)
    for name in ("flex-1", "flex-2"):
        op = insert_op(instances, flex_instance(name, run_s=3600))
        compute_result(ops, PROJECT, ZONE, op)  # the request is accepted: DONE with no error
        assert ops.get(project=PROJECT, zone=ZONE, operation=op.name).status == compute_v1.Operation.Status.DONE
        got = instances.get(project=PROJECT, zone=ZONE, instance=name)
        assert got.status == "PENDING" and not got.resource_status.scheduling.termination_timestamp
    passes_after(sim, 3)  # several passes over the queue with no capacity
    assert [sim.status_of(ZONE, n) for n in ("flex-1", "flex-2")] == ["PENDING", "PENDING"]
    assert sim.live_nodes() == [] and sim.max_live() == 0  # PENDING holds no hardware
    sim.set_capacity(ZONE, G2, 1, provisioning_model="FLEX_START")
    sim.wait_for(lambda: sim.status_of(ZONE, "flex-1") == "RUNNING", timeout=10, what="flex-1 running")
    passes_after(sim, 3)
    assert sim.status_of(ZONE, "flex-2") == "PENDING"  # one slot: the first request got it
    assert states(sim, "flex-1") == ["PENDING", "PROVISIONING", "STAGING", "RUNNING"]
    assert sim.max_live() == 1
    assert instances.get(project=PROJECT, zone=ZONE, instance="flex-1").resource_status.scheduling.termination_timestamp


def test_an_expired_request_is_deleted_by_compute(sim_factory):
    sim = sim_factory(run_duration_scale=SLOW)
    sim.set_capacity(ZONE, G2, 0, provisioning_model="FLEX_START")
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1", wait_s=90)))
    assert instances.get(project=PROJECT, zone=ZONE, instance="flex-1").status == "PENDING"
    sim.wait_for(lambda: sim.status_of(ZONE, "flex-1") is None, timeout=10, what="the request's expiry")
    with pytest.raises(exceptions.NotFound):
        instances.get(project=PROJECT, zone=ZONE, instance="flex-1")
    record = sim.history()[0]
    assert record["live"] == [] and record["deletedAt"] - record["createdAt"] == pytest.approx(90 * SLOW, abs=0.3)
    sim.set_capacity(ZONE, G2, None, provisioning_model="FLEX_START")
    # Capacity after the expiry brings nothing back: nothing waits for it.
    assert sim.status_of(ZONE, "flex-1") is None and sim.compute.queue == []


def test_with_flex_start_insert_wait_the_insert_ends_when_the_vm_runs_or_the_request_expires(sim_factory):
    sim = sim_factory(run_duration_scale=SLOW, flex_start_insert="wait")
    sim.set_capacity(ZONE, G2, 0, provisioning_model="FLEX_START")
    instances, ops = compute_clients(sim.endpoint)
    expiring = insert_op(instances, flex_instance("flex-1", wait_s=90))
    with pytest.raises(exceptions.ServiceUnavailable) as info:
        compute_result(ops, PROJECT, ZONE, expiring)
    assert info.value.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert sim.status_of(ZONE, "flex-1") is None
    waiting = insert_op(instances, flex_instance("flex-2"))
    passes_after(sim, 3)
    assert ops.get(project=PROJECT, zone=ZONE, operation=waiting.name).status != compute_v1.Operation.Status.DONE
    sim.set_capacity(ZONE, G2, 1, provisioning_model="FLEX_START")
    compute_result(ops, PROJECT, ZONE, waiting)
    assert instances.get(project=PROJECT, zone=ZONE, instance="flex-2").status == "RUNNING"


def test_a_pending_request_can_be_withdrawn(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    sim.set_capacity(ZONE, G2, 0, provisioning_model="FLEX_START")
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1")))
    with pytest.raises(exceptions.BadRequest):  # stop has nothing to stop
        instances.stop_unary(project=PROJECT, zone=ZONE, instance="flex-1")
    compute_result(ops, PROJECT, ZONE, instances.delete_unary(project=PROJECT, zone=ZONE, instance="flex-1"))
    sim.set_capacity(ZONE, G2, None, provisioning_model="FLEX_START")
    # Withdrawn: nothing waits for the capacity, so none serves it.
    assert sim.status_of(ZONE, "flex-1") is None and sim.compute.queue == [] and sim.max_live() == 0


def test_the_run_end_deletes_the_vm_without_a_preemption(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1")))
    end = instant(instances.get(project=PROJECT, zone=ZONE, instance="flex-1").resource_status.scheduling
                  .termination_timestamp)
    metadata = sim.metadata_server(ZONE, "flex-1")
    assert metadata.get("instance/preempted") == "FALSE"
    written = []
    original = metadata.set
    metadata.set = lambda path, value: (written.append((path, value)), original(path, value))
    with pytest.raises(SimError, match="never preempted"):
        sim.preempt(ZONE, "flex-1")
    sim.wait_for(lambda: sim.status_of(ZONE, "flex-1") is None, timeout=10, what="the run's end")
    assert time.time() == pytest.approx(end, abs=0.5)
    with pytest.raises(exceptions.NotFound):
        instances.get(project=PROJECT, zone=ZONE, instance="flex-1")
    assert ("instance/preempted", "TRUE") not in written
    assert states(sim, "flex-1")[-2:] == ["STOPPING", "DELETED"]
    assert not [e for e in sim.audit_log if "preempted" in str(e)]
    assert not [o for o in ops.list(project=PROJECT, zone=ZONE) if "preempted" in o.operation_type]


def test_the_run_end_stops_a_stop_vm_and_a_start_begins_a_new_run(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1", action="STOP")))
    first = instances.get(project=PROJECT, zone=ZONE, instance="flex-1").resource_status.scheduling.termination_timestamp
    sim.wait_for(lambda: sim.status_of(ZONE, "flex-1") == "TERMINATED", timeout=10, what="the run's end")
    stopped = instances.get(project=PROJECT, zone=ZONE, instance="flex-1")
    assert not stopped.resource_status.scheduling.termination_timestamp  # cleared once it stops
    compute_result(ops, PROJECT, ZONE, instances.start_unary(project=PROJECT, zone=ZONE, instance="flex-1"))
    again = instances.get(project=PROJECT, zone=ZONE, instance="flex-1").resource_status.scheduling.termination_timestamp
    assert instant(again) - instant(first) >= 600 * SCALE
    sim.wait_for(lambda: sim.status_of(ZONE, "flex-1") == "TERMINATED", timeout=10, what="the second run's end")
    assert not [e for e in sim.audit_log if "preempted" in str(e)]


@pytest.mark.parametrize("instance, field", [
    (flex_instance("f", run_s=None), "resource.scheduling.maxRunDuration"),
    (flex_instance("f", run_s=599), "resource.scheduling.maxRunDuration"),
    (flex_instance("f", run_s=604_801), "resource.scheduling.maxRunDuration"),
    (flex_instance("f", action=None), "resource.scheduling.instanceTerminationAction"),
    (flex_instance("f", wait_s=89), "resource.params.requestValidForDuration"),
    (flex_instance("f", wait_s=7201), "resource.params.requestValidForDuration"),
    (flex_instance("f", preemption_notice_duration=compute_v1.Duration(seconds=120)),
     "resource.scheduling.preemptionNoticeDuration"),
    (flex_instance("f", graceful_shutdown=compute_v1.SchedulingGracefulShutdown(enabled=True)),
     "resource.scheduling.gracefulShutdown"),
    # Not a machine type flex-start runs (issue #36 D2): N1 with a T4 attached, A4X (accelerator-optimized, excluded).
    (on_machine(flex_instance("f"), "n1-standard-4", "nvidia-tesla-t4"), "resource.scheduling.provisioningModel"),
    (on_machine(flex_instance("f"), "a4x-highgpu-4g"), "resource.scheduling.provisioningModel"),
], ids=["no-run", "run-599", "run-604801", "no-action", "wait-89", "wait-7201", "notice", "graceful", "n1-t4", "a4x"])
def test_invalid_flex_start_fields_are_400_naming_the_field(sim_factory, instance, field):
    sim = sim_factory()
    instances, _ = compute_clients(sim.endpoint)
    with pytest.raises(exceptions.BadRequest) as info:
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance)
    assert f"'{field}'" in info.value.message
    assert sim.history() == []


def test_bounds_and_no_wait_are_accepted(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1", run_s=600, wait_s=90)))
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-2", run_s=604_800, wait_s=0)))
    sim.set_capacity(ZONE, G2, 0, provisioning_model="FLEX_START")
    with pytest.raises(exceptions.ServiceUnavailable):  # a request with no wait is refused at once
        compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-3", wait_s=0)))
    assert sim.status_of(ZONE, "flex-3") is None


def test_flex_start_is_charged_to_the_preemptible_quota(sim_factory):
    sim = sim_factory(run_duration_scale=SCALE)
    sim.set_quota(REGION, G2, 1, provisioning_model="SPOT")
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-1")))
    with pytest.raises(exceptions.Forbidden) as info:  # the flex-start VM holds the one preemptible GPU
        compute_result(ops, PROJECT, ZONE, insert_op(instances, spot_instance("spot-1")))
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS" in info.value.errors[0].message
    with pytest.raises(exceptions.Forbidden) as info:  # a quota refusal does not wait, whatever the request's wait
        compute_result(ops, PROJECT, ZONE, insert_op(instances, flex_instance("flex-2")))
    assert info.value.errors[0].code == "QUOTA_EXCEEDED" and "PREEMPTIBLE_NVIDIA_L4_GPUS" in info.value.errors[0].message
    assert sim.status_of(ZONE, "flex-2") is None
    standard = spot_instance("std-1")
    standard.scheduling.provisioning_model = "STANDARD"
    compute_result(ops, PROJECT, ZONE, insert_op(instances, standard))  # on-demand quota is another
    with pytest.raises(ValueError, match="preemptible quota"):
        sim.set_quota(REGION, G2, 1, provisioning_model="FLEX_START")
