"""sim/'s Compute Engine subset, driven only through the real google-cloud-compute client (REST transport)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from sim_fixtures import PROJECT, compute_clients, compute_operation, compute_result, sim_factory, sim_server  # noqa: F401

ZONE = "us-central1-a"
T4 = "nvidia-tesla-t4"


def spot_instance(name: str, *, action: str = "STOP", job: str = "job-a", accel: str | None = T4) -> compute_v1.Instance:
    inst = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
        scheduling=compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action=action,
                                         on_host_maintenance="TERMINATE", automatic_restart=False),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="respawn-job", value=job),
                                            compute_v1.Items(key="respawn-attempt", value="1")]),
        labels={"respawn-job": job, "respawn-attempt": "1"},
    )
    if accel:
        inst.guest_accelerators = [compute_v1.AcceleratorConfig(
            accelerator_type=f"projects/{PROJECT}/zones/{ZONE}/acceleratorTypes/{accel}", accelerator_count=1)]
    return inst


def insert(instances, ops, inst, zone=ZONE):
    op = instances.insert_unary(project=PROJECT, zone=zone, instance_resource=inst)
    return compute_result(ops, PROJECT, zone, op)


def test_insert_progresses_to_running_with_fields_kept(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1"))
    assert op.status != compute_v1.Operation.Status.DONE, "an insert must finish asynchronously"
    compute_result(ops, PROJECT, ZONE, op)
    got = instances.get(project=PROJECT, zone=ZONE, instance="job-a-1")
    assert got.status == "RUNNING"
    assert got.scheduling.provisioning_model == "SPOT"
    assert got.scheduling.instance_termination_action == "STOP"
    assert got.machine_type.endswith("/zones/us-central1-a/machineTypes/n1-standard-4")
    assert got.guest_accelerators[0].accelerator_type.endswith("/acceleratorTypes/nvidia-tesla-t4")
    assert got.guest_accelerators[0].accelerator_count == 1
    assert {i.key: i.value for i in got.metadata.items} == {"respawn-job": "job-a", "respawn-attempt": "1"}
    assert got.labels["respawn-job"] == "job-a"
    assert got.id > 0
    states = [s for _, s in sim_server.history()[0]["states"]]
    assert states == ["PROVISIONING", "STAGING", "RUNNING"]


def test_list_get_delete_and_not_found(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    insert(instances, ops, spot_instance("job-b-1", job="job-b"))
    names = sorted(i.name for i in instances.list(project=PROJECT, zone=ZONE))
    assert names == ["job-a-1", "job-b-1"]
    only_b = [i.name for i in instances.list(request=compute_v1.ListInstancesRequest(
        project=PROJECT, zone=ZONE, filter='labels.respawn-job = "job-b"'))]
    assert only_b == ["job-b-1"]
    assert list(instances.list(project=PROJECT, zone="europe-west4-a")) == []
    compute_result(ops, PROJECT, ZONE, instances.delete_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    with pytest.raises(exceptions.NotFound):
        instances.get(project=PROJECT, zone=ZONE, instance="job-a-1")
    with pytest.raises(exceptions.NotFound):
        instances.delete_unary(project=PROJECT, zone=ZONE, instance="job-a-1")
    assert sim_server.history()[0]["deletedAt"] is not None


def test_second_insert_is_409_already_exists(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    with pytest.raises(exceptions.Conflict) as info:
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1"))
    assert "already exists" in info.value.message
    assert info.value.errors[0]["reason"] == "alreadyExists"


def test_stop_start_keeps_the_instance(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    compute_result(ops, PROJECT, ZONE, instances.stop_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    assert instances.get(project=PROJECT, zone=ZONE, instance="job-a-1").status == "TERMINATED"
    compute_result(ops, PROJECT, ZONE, instances.start_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    assert instances.get(project=PROJECT, zone=ZONE, instance="job-a-1").status == "RUNNING"


def test_operations_wait_returns_the_done_operation(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1"))
    done = ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
    assert done.status == compute_v1.Operation.Status.DONE
    assert done.operation_type == "insert"
    assert done.target_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/job-a-1")


def test_stockout_raises_service_unavailable_with_zone_resource_pool_exhausted(sim_server):
    sim_server.set_capacity(ZONE, T4, 0)
    instances, ops = compute_clients(sim_server.endpoint)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1"))
    with pytest.raises(exceptions.ServiceUnavailable) as info:
        compute_result(ops, PROJECT, ZONE, op)
    assert info.value.code == 503
    assert info.value.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert "does not have enough resources" in info.value.errors[0].message
    final = ops.get(project=PROJECT, zone=ZONE, operation=op.name)
    assert final.http_error_status_code == 503
    assert final.error.errors[0].error_details[0].error_info.reason == "resource_availability"
    with pytest.raises(exceptions.NotFound):  # a refused insert leaves nothing behind
        instances.get(project=PROJECT, zone=ZONE, instance="job-a-1")


def test_quota_raises_forbidden_with_quota_exceeded(sim_server):
    sim_server.set_quota("us-central1", T4, 1)
    instances, ops = compute_clients(sim_server.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    op = instances.insert_unary(project=PROJECT, zone="us-central1-b",
                                instance_resource=spot_instance("job-b-1", job="job-b"))
    with pytest.raises(exceptions.Forbidden) as info:
        compute_result(ops, PROJECT, "us-central1-b", op)
    assert info.value.errors[0].code == "QUOTA_EXCEEDED"
    assert "PREEMPTIBLE_NVIDIA_T4_GPUS" in info.value.errors[0].message


def test_capacity_timeline_stocks_out_and_recovers(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    t = sim_server.now()
    sim_server.set_capacity_timeline(ZONE, T4, [(0, 1), (t + 0.5, 0), (t + 1.0, None)])
    insert(instances, ops, spot_instance("job-a-1"))
    with pytest.raises(exceptions.ServiceUnavailable):  # limit 1, one in use
        insert(instances, ops, spot_instance("job-b-1", job="job-b"))
    sim_server.wait_for(lambda: sim_server.now() > t + 1.05, what="the capacity recovery step")
    insert(instances, ops, spot_instance("job-b-1", job="job-b"))


def test_spot_only_stockout_leaves_on_demand_available(sim_server):
    sim_server.set_capacity(ZONE, T4, 0, provisioning_model="SPOT")
    instances, ops = compute_clients(sim_server.endpoint)
    with pytest.raises(exceptions.ServiceUnavailable):
        insert(instances, ops, spot_instance("job-a-1"))
    standard = spot_instance("job-a-2")
    standard.scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE")
    insert(instances, ops, standard)


def test_start_of_a_stopped_instance_meets_the_stockout(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    compute_result(ops, PROJECT, ZONE, instances.stop_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    sim_server.set_capacity(ZONE, T4, 0)
    with pytest.raises(exceptions.ServiceUnavailable):
        compute_result(ops, PROJECT, ZONE, instances.start_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    assert instances.get(project=PROJECT, zone=ZONE, instance="job-a-1").status == "TERMINATED"


def test_injected_api_faults_answer_503_on_the_call_itself(sim_server):
    sim_server.set_api_faults(count=1, methods=("insert",))
    instances, ops = compute_clients(sim_server.endpoint)
    with pytest.raises(exceptions.ServiceUnavailable):
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1"))
    insert(instances, ops, spot_instance("job-a-1"))  # the next call goes through


def test_extended_operation_helper_reports_done_and_errors(sim_server):
    instances, ops = compute_clients(sim_server.endpoint)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1"))
    ext = compute_operation(ops, PROJECT, ZONE, op)
    ext.result(timeout=30)
    assert ext.done() and ext.exception() is None


def test_instances_without_accelerators_use_the_machine_type_as_capacity_key(sim_server):
    sim_server.set_capacity(ZONE, "n1-standard-4", 0)
    instances, ops = compute_clients(sim_server.endpoint)
    with pytest.raises(exceptions.ServiceUnavailable):
        insert(instances, ops, spot_instance("cpu-1", accel=None))


def test_serial_port_output_serves_the_nodes_console_through_the_real_client(sim_factory):
    # The node's boot command prints to its console (what a real guest's startup script writes to serial port 1).
    sim = sim_factory(boot_command=["sh", "-c", "echo 'startup-script: fetching the agent'; "
                                                "echo 'startup-script: ERROR python3 not found' ; exit 1"])
    instances, ops = compute_clients(sim.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    log = sim.compute.instances[(ZONE, "job-a-1")].runtime.console_log
    sim.wait_for(lambda: log.exists() and b"ERROR" in log.read_bytes(), timeout=10, what="the boot's console output")

    def serial(name, **kw):
        return instances.get_serial_port_output(request=compute_v1.GetSerialPortOutputInstanceRequest(
            project=PROJECT, zone=ZONE, instance=name, **kw))

    full = serial("job-a-1")
    assert full.contents == "startup-script: fetching the agent\nstartup-script: ERROR python3 not found\n"
    assert (full.start, full.next_) == (0, len(full.contents)) and full.kind == "compute#serialPortOutput"
    assert full.self_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/job-a-1/serialPort")
    # A negative start: the most recent bytes; the answer's start says where they begin.
    tail = serial("job-a-1", port=1, start=-16)
    assert tail.contents == "python3 not found\n"[-16:] and tail.start == full.next_ - 16 and tail.next_ == full.next_
    # Reading on from `next` gives nothing new; more than there is gives everything from the first byte.
    assert serial("job-a-1", start=full.next_).contents == ""
    assert serial("job-a-1", start=-10_000).contents == full.contents
    assert serial("job-a-1", port=2).contents == ""
    with pytest.raises(exceptions.BadRequest):
        serial("job-a-1", port=5)
    with pytest.raises(exceptions.NotFound):
        serial("job-a-9")


def test_serial_port_output_keeps_the_last_megabyte(sim_server):
    from sim.compute import SERIAL_BUFFER

    instances, ops = compute_clients(sim_server.endpoint)
    insert(instances, ops, spot_instance("job-a-1"))
    log = sim_server.compute.instances[(ZONE, "job-a-1")].runtime.console_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"a" * 100 + b"b" * SERIAL_BUFFER)
    out = instances.get_serial_port_output(request=compute_v1.GetSerialPortOutputInstanceRequest(
        project=PROJECT, zone=ZONE, instance="job-a-1", start=0))
    assert (out.start, out.next_) == (100, 100 + SERIAL_BUFFER) and set(out.contents) == {"b"}
