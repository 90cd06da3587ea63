"""functions/events.py: audit LogEntries (the real shapes of gcp-facts §1-§2) → Signal, or Undecodable."""

import copy

import pytest

from respawn.control import events

PREEMPTED = {
    "protoPayload": {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "status": {"message": "Instance was preempted."},
        "authenticationInfo": {"principalEmail": "system@google.com"},
        "serviceName": "compute.googleapis.com",
        "methodName": "compute.instances.preempted",
        "resourceName": "projects/mock-project/zones/europe-west1-c/instances/llama-ft-3",
        "request": {"@type": "type.googleapis.com/compute.instances.preempted"},
    },
    "insertId": "qnwer3e38dfz",
    "resource": {"type": "gce_instance", "labels": {"instance_id": "1844488190", "project_id": "mock-project",
                                                   "zone": "europe-west1-c"}},
    "timestamp": "2023-09-16T10:42:31.325309Z",
    "severity": "INFO",
    "logName": "projects/mock-project/logs/cloudaudit.googleapis.com%2Fsystem_event",
    "operation": {"id": "systemevent-1694860946116", "producer": "compute.instances.preempted", "first": True, "last": True},
}


def entry(method="compute.instances.preempted", resource_name=None, **payload):
    e = copy.deepcopy(PREEMPTED)
    e["protoPayload"]["methodName"] = method
    if resource_name is not None:
        e["protoPayload"]["resourceName"] = resource_name
    e["protoPayload"].update(payload)
    return e


@pytest.mark.parametrize(
    "method,cause",
    [
        ("compute.instances.preempted", "preempted"),
        ("compute.instances.hostError", "host_error"),
        ("compute.instances.guestTerminate", "guest_terminate"),
        ("compute.instances.terminateOnHostMaintenance", "host_maintenance"),
    ],
)
def test_compute_system_events_name_the_node_zone_and_cause(method, cause):
    sig = events.decode(entry(method))
    assert (sig.zone, sig.node, sig.cause, sig.job_id, sig.attempt) == ("europe-west1-c", "llama-ft-3", cause, "llama-ft", 3)
    assert sig.project == "mock-project" and not sig.tpu_worker


@pytest.mark.parametrize("service", ["tpu.googleapis.com", None])
def test_tpu_terminate_event_names_the_tpu_node_and_reason(service):
    # The sink admits these by methodName and resourceName (gcp-facts §2): serviceName is unverified, never needed.
    e = entry("tpu.nodes.terminate", "projects/p/locations/us-west4-a/nodes/jax-lm-12",
              metadata={"terminateReason": "PREEMPTED"}, serviceName=service)
    if service is None:
        del e["protoPayload"]["serviceName"]
    e["resource"] = {"type": "tpu_worker", "labels": {"zone": "us-west4-a", "node_id": "jax-lm-12"}}
    sig = events.decode(e)
    assert (sig.zone, sig.node, sig.cause, sig.job_id, sig.attempt, sig.detail) == (
        "us-west4-a", "jax-lm-12", "tpu_terminated", "jax-lm", 12, "PREEMPTED")


def test_tpu_worker_vm_preemption_is_decoded_without_a_job():
    e = entry(resource_name="projects/p/zones/us-west4-a/instances/t1v-n-8f3a9c21-w-0")
    e["resource"]["labels"]["zone"] = "us-west4-a"
    sig = events.decode(e)
    assert sig.tpu_worker and sig.job_id is None and sig.zone == "us-west4-a" and sig.cause == "preempted"


@pytest.mark.parametrize(
    "bad,why",
    [
        (None, "JSON object"),
        ([], "JSON object"),
        ({}, "protoPayload"),
        ({"protoPayload": "x"}, "protoPayload"),
        (entry("compute.instances.insert"), "not a node-loss event"),
        (entry("compute.instances.migrateOnHostMaintenance"), "not a node-loss event"),
        (entry(resource_name=None, **{"resourceName": 7}), "no resourceName"),
        (entry(resource_name="projects/p/global/networks/default"), "names no instance"),
        (entry(resource_name="projects/p/zones/europe-west1-c/instances/Web_Server"), "not a Respawn node name"),
        (entry(resource_name="projects/p/zones/europe-west1-c/instances/web"), "not a Respawn node name"),
        (entry(resource_name="projects/p/zones/europe-west1-c/instances/job-0"), "not a Respawn node name"),
    ],
)
def test_malformed_or_foreign_entries_are_undecodable_with_a_reason(bad, why):
    with pytest.raises(events.Undecodable, match=why):
        events.decode(bad)


def test_contradicting_zone_labels_are_rejected():
    e = entry()
    e["resource"]["labels"]["zone"] = "us-east1-b"
    with pytest.raises(events.Undecodable, match="contradicts"):
        events.decode(e)


def test_the_entry_timestamp_is_kept_with_nanoseconds_cut_to_micro():
    e = entry()
    e["timestamp"] = "2023-09-16T10:42:31.325309123Z"
    at = events.decode(e).at
    assert at.isoformat() == "2023-09-16T10:42:31.325309+00:00"
    e["timestamp"] = "yesterday"
    assert events.decode(e).at is None
