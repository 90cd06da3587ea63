"""The audit-log path: LogEntry shapes (gcp-facts §1, §2), the one sink-filter definition, and the router that
publishes selected entries to the Pub/Sub emulator as a Logging sink does."""

from __future__ import annotations

import json
import re

from google.cloud import pubsub_v1, tpu_v2

from respawn import audit, selftest
from sim import audit_entries
from sim.audit_router import AuditRouter
from sim_fixtures import PROJECT, compute_clients, compute_result, sim_factory, tpu_client  # noqa: F401
from test_sim_compute import ZONE, spot_instance

# The example entry cited in docs/gcp-facts.md §1, with mock-project/mock-instance replaced by ours.
EXAMPLE = {
    "protoPayload": {"@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                     "status": {"message": "Instance was preempted."},
                     "authenticationInfo": {"principalEmail": "system@google.com"},
                     "serviceName": "compute.googleapis.com", "methodName": "compute.instances.preempted",
                     "resourceName": f"projects/{PROJECT}/zones/{ZONE}/instances/job-a-1",
                     "request": {"@type": "type.googleapis.com/compute.instances.preempted"}},
    "resource": {"type": "gce_instance", "labels": {"project_id": PROJECT, "zone": ZONE}},
    "severity": "INFO",
    "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fsystem_event",
    "operation": {"producer": "compute.instances.preempted", "first": True, "last": True},
}
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$")


def preempted_instance(sim, name="job-a-1"):
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance(name)))
    inst = instances.get(project=PROJECT, zone=ZONE, instance=name)
    sim.preempt(ZONE, name)
    sim.wait_for(lambda: any(e["protoPayload"]["methodName"] == "compute.instances.preempted"
                             and e["protoPayload"]["resourceName"].endswith(f"/{name}") for e in sim.audit_log),
                 what="the preemption audit entry")
    return inst


def test_compute_preemption_entry_matches_the_reference_field_by_field(sim_factory):
    sim = sim_factory()
    inst = preempted_instance(sim)
    [entry] = [e for e in sim.audit_log if e["protoPayload"]["methodName"] == "compute.instances.preempted"]
    assert set(entry) == {"protoPayload", "insertId", "resource", "timestamp", "severity", "logName", "operation",
                          "receiveTimestamp"}
    assert entry["protoPayload"] == EXAMPLE["protoPayload"]
    assert entry["resource"]["type"] == "gce_instance"
    assert entry["resource"]["labels"] == {**EXAMPLE["resource"]["labels"], "instance_id": str(inst.id)}
    assert entry["severity"] == EXAMPLE["severity"]
    assert entry["logName"] == EXAMPLE["logName"] == audit.log_name(PROJECT)
    assert {k: entry["operation"][k] for k in ("producer", "first", "last")} == EXAMPLE["operation"]
    assert re.match(r"^systemevent-\d{13}-", entry["operation"]["id"])
    assert re.match(r"^[a-z0-9]{12}$", entry["insertId"])
    assert TS.match(entry["timestamp"]) and TS.match(entry["receiveTimestamp"])
    assert entry["receiveTimestamp"] >= entry["timestamp"]
    assert sim.status_of(ZONE, "job-a-1") == "TERMINATED", "by default the entry is written once the VM is down"


def test_host_error_entry_has_the_same_shape(sim_factory):
    sim = sim_factory()
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1")))
    sim.host_error(ZONE, "job-a-1")
    entry = sim.audit_log[-1]
    assert entry["protoPayload"]["methodName"] == "compute.instances.hostError"
    assert entry["protoPayload"]["status"]["message"] == "Instance terminated by Compute Engine."
    assert entry["protoPayload"]["request"]["@type"] == "type.googleapis.com/compute.instances.hostError"
    assert entry["operation"]["producer"] == "compute.instances.hostError"
    assert audit.matches(entry, PROJECT)


def test_tpu_preemption_writes_node_terminate_and_worker_preempted(sim_factory):
    sim = sim_factory()
    client = tpu_client(sim.endpoint)
    zone = "europe-west4-a"
    parent = f"projects/{PROJECT}/locations/{zone}"
    client.create_node(parent=parent, node_id="job-t-1", node=tpu_v2.Node(
        accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite",
        scheduling_config=tpu_v2.SchedulingConfig(spot=True))).result(timeout=30)
    sim.preempt(zone, "job-t-1")
    sim.wait_for(lambda: sim.status_of(zone, "job-t-1") == "PREEMPTED", what="TPU node PREEMPTED")
    system = [e for e in sim.audit_log if audit.matches(e, PROJECT)]
    terminate, worker = system
    assert terminate["protoPayload"]["methodName"] == "tpu.nodes.terminate"
    assert terminate["protoPayload"]["serviceName"] == "tpu.googleapis.com"
    assert terminate["protoPayload"]["resourceName"] == f"{parent}/nodes/job-t-1"
    assert terminate["protoPayload"]["metadata"]["terminateReason"] == "PREEMPTED"
    assert terminate["resource"]["type"] == "audited_resource"
    assert worker["protoPayload"]["methodName"] == "compute.instances.preempted"
    assert re.match(rf"^projects/{PROJECT}/zones/{zone}/instances/t1v-n-[0-9a-f]{{8}}-w-0$",
                    worker["protoPayload"]["resourceName"])
    assert worker["resource"]["labels"]["zone"] == zone


def test_audit_timing_start_writes_the_entry_when_the_notice_begins(sim_factory):
    sim = sim_factory(audit_timing="start", notice_seconds=5, boot_command=None)
    instances, ops = compute_clients(sim.endpoint)
    compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=spot_instance("job-a-1")))
    sim.preempt(ZONE, "job-a-1")
    assert sim.audit_log[-1]["protoPayload"]["methodName"] == "compute.instances.preempted"


def test_sink_filter_text_and_matches_come_from_one_definition():
    text = audit.sink_filter("p")
    # OR binds tighter than AND in the Logging query language: each operand of the OR is parenthesised.
    assert text == (
        '(logName="projects/p/logs/cloudaudit.googleapis.com%2Fsystem_event" AND protoPayload.methodName=('
        + " OR ".join(f'"{m}"' for m in audit.METHODS) + ")) OR "
        '(protoPayload.methodName="tpu.nodes.terminate" AND protoPayload.resourceName:"projects/p/") OR '
        '(logName="projects/p/logs/respawn-selftest")'
    )
    # the self-test's probe passes, in its own project only
    assert audit.matches(selftest.probe_entry("p", "0123456789abcdef"), "p")
    assert not audit.matches(selftest.probe_entry("other", "0123456789abcdef"), "p")
    assert "compute.instances.preempted" in audit.METHODS and "tpu.nodes.terminate" in audit.METHODS
    base = {"logName": audit.log_name("p"), "protoPayload": {"methodName": "compute.instances.preempted"}}
    assert audit.matches(base, "p")
    assert not audit.matches(base, "other")
    assert not audit.matches({**base, "protoPayload": {"methodName": "v1.compute.instances.insert"}}, "p")
    assert not audit.matches({**base, "logName": audit.log_name("p", "cloudaudit.googleapis.com/activity")}, "p")
    assert not audit.matches({"logName": audit.log_name("p")}, "p")
    # every method the filter names is one a rendered term carries
    for method in audit.METHODS:
        assert f'"{method}"' in text


ACTIVITY_LOG = "cloudaudit.googleapis.com/activity"


def _with_payload(entry: dict, **payload) -> dict:
    """A copy of `entry` with protoPayload fields replaced; a None value removes the field."""
    merged = {**entry["protoPayload"], **payload}
    return {**entry, "protoPayload": {k: v for k, v in merged.items() if v is not None}}


def test_tpu_node_terminate_is_selected_by_method_and_resource_name_in_any_log():
    # As the public example filters (gcp-facts §2): methodName and a projects/P/ resourceName. Which log carries the
    # entry, and its serviceName, are unverified: the filter depends on neither.
    for log_id in (audit.SYSTEM_EVENT_LOG_ID, ACTIVITY_LOG, "cloudaudit.googleapis.com/data_access"):
        entry = audit_entries.tpu_node_terminate(project=PROJECT, zone="europe-west4-a", node_name="job-t-1",
                                                 log_id=log_id)
        assert entry["logName"] == audit.log_name(PROJECT, log_id)
        assert audit.matches(entry, PROJECT), log_id
        assert audit.matches(_with_payload(entry, serviceName=None), PROJECT), log_id
        assert audit.matches(_with_payload(entry, serviceName="compute.googleapis.com"), PROJECT), log_id
    entry = audit_entries.tpu_node_terminate(project=PROJECT, zone="europe-west4-a", node_name="job-t-1",
                                             log_id=ACTIVITY_LOG)
    # The has operator ignores case, as Logging's string comparisons do.
    assert audit.matches(_with_payload(entry, resourceName=entry["protoPayload"]["resourceName"].upper()), PROJECT)
    # Only that method, and only this project's resource names: the rest still needs the system_event log.
    assert not audit.matches(_with_payload(entry, methodName="tpu.nodes.delete"), PROJECT)
    for other in (f"projects/{PROJECT}x/locations/europe-west4-a/nodes/job-t-1",
                  f"projects/other/locations/europe-west4-a/nodes/job-t-1", f"projects/{PROJECT}", None, 7):
        assert not audit.matches(_with_payload(entry, resourceName=other), PROJECT), other
    assert not audit.matches(entry, "other")
    preempted = audit_entries.compute_system_event("compute.instances.preempted", project=PROJECT, zone=ZONE,
                                                   instance_name="job-a-1", instance_id="1")
    assert audit.matches(preempted, PROJECT)
    assert not audit.matches({**preempted, "logName": audit.log_name(PROJECT, ACTIVITY_LOG)}, PROJECT)


def test_router_routes_a_tpu_terminate_entry_from_the_activity_log(pubsub_emulator):
    router = AuditRouter(PROJECT, topic="sink-tpu-activity")
    subscriber, sub = _subscription(PROJECT, "sink-tpu-activity", "sink-tpu-activity-sub")
    entry = audit_entries.tpu_node_terminate(project=PROJECT, zone="europe-west4-a", node_name="job-t-1",
                                             log_id=ACTIVITY_LOG)
    router(entry)
    router(audit_entries.activity("tpu.nodes.delete", project=PROJECT, service="tpu.googleapis.com",
                                  resource_name=f"projects/{PROJECT}/locations/europe-west4-a/nodes/job-t-1"))
    [msg] = _pull_all(subscriber, sub, 1)
    assert json.loads(msg.message.data) == entry and router.published == [entry]
    assert [e["protoPayload"]["methodName"] for e in router.rejected] == ["tpu.nodes.delete"]
    router.close()


def _pull_all(subscriber, subscription, want: int, timeout: float = 30) -> list:
    import time

    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        resp = subscriber.pull(subscription=subscription, max_messages=10, timeout=5, return_immediately=False)
        if resp.received_messages:
            subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in resp.received_messages])
            got.extend(resp.received_messages)
    return got


def _subscription(project: str, topic: str, name: str) -> tuple:
    subscriber = pubsub_v1.SubscriberClient()
    sub = subscriber.subscription_path(project, name)
    subscriber.create_subscription(name=sub, topic=pubsub_v1.PublisherClient.topic_path(project, topic))
    return subscriber, sub


def test_router_publishes_selected_entries_as_a_sink_does(pubsub_emulator, sim_factory):
    router = AuditRouter(PROJECT, topic="sink-basic")
    subscriber, sub = _subscription(PROJECT, "sink-basic", "sink-basic-sub")
    sim = sim_factory(audit_sink=router)
    preempted_instance(sim)
    [msg] = _pull_all(subscriber, sub, 1)
    entry = json.loads(msg.message.data)
    assert entry["protoPayload"]["methodName"] == "compute.instances.preempted"
    assert entry == [e for e in sim.audit_log if audit.matches(e, PROJECT)][0]
    assert msg.message.attributes["logging.googleapis.com/timestamp"] == entry["timestamp"]
    # the insert's Admin Activity entry reached the router but was not selected
    assert [e["protoPayload"]["methodName"] for e in router.rejected] == ["v1.compute.instances.insert"]
    assert _pull_all(subscriber, sub, 1, timeout=1) == []
    router.close()


def test_router_duplicates_and_drops_on_request(pubsub_emulator, sim_factory):
    router = AuditRouter(PROJECT, topic="sink-faults", duplicates=2)
    subscriber, sub = _subscription(PROJECT, "sink-faults", "sink-faults-sub")
    sim = sim_factory(audit_sink=router)
    preempted_instance(sim, "job-a-1")
    assert len(_pull_all(subscriber, sub, 3)) == 3
    router.drop_next(1)
    preempted_instance(sim, "job-b-1")
    sim.wait_for(lambda: router.dropped, what="the router dropping an entry")
    assert [e["protoPayload"]["resourceName"].rsplit("/", 1)[1] for e in router.dropped] == ["job-b-1"]
    assert _pull_all(subscriber, sub, 1, timeout=1) == []
    router.close()
