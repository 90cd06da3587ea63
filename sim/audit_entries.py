"""LogEntry dicts in the shape Cloud Audit Logs writes them (docs/gcp-facts.md §1 and §2).

System events (preemption, host error, TPU node terminate) go to the `cloudaudit.googleapis.com/system_event`
log; user API calls (insert, delete, ...) go to `cloudaudit.googleapis.com/activity`, which the sink filter must
not select.
"""

from __future__ import annotations

import random
import string
import time
from datetime import datetime, timedelta, timezone

from respawn.audit import SYSTEM_EVENT_LOG_ID, log_name

STATUS_MESSAGES = {
    "compute.instances.preempted": "Instance was preempted.",
    "compute.instances.hostError": "Instance terminated by Compute Engine.",
    "compute.instances.guestTerminate": "Instance terminated by guest OS shutdown.",
    "compute.instances.terminateOnHostMaintenance": "Instance terminated during Compute Engine maintenance.",
}

_rng = random.Random()


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def _insert_id() -> str:
    return "".join(_rng.choices(string.ascii_lowercase + string.digits, k=12))


def _system_operation(method: str, now_ms: int) -> dict:
    suffix = "-".join(f"{_rng.getrandbits(32):08x}" for _ in range(3))
    return {"id": f"systemevent-{now_ms}-{suffix}", "producer": method, "first": True, "last": True}


def compute_system_event(method: str, *, project: str, zone: str, instance_name: str, instance_id: str) -> dict:
    now = datetime.now(timezone.utc)
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {"message": STATUS_MESSAGES.get(method, "")},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "compute.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/{project}/zones/{zone}/instances/{instance_name}",
            "request": {"@type": f"type.googleapis.com/{method}"},
        },
        "insertId": _insert_id(),
        "resource": {"type": "gce_instance", "labels": {"instance_id": instance_id, "project_id": project, "zone": zone}},
        "timestamp": _ts(now),
        "severity": "INFO",
        "logName": log_name(project),
        "operation": _system_operation(method, int(time.time() * 1000)),
        "receiveTimestamp": _ts(now + timedelta(milliseconds=450)),
    }


def tpu_node_terminate(*, project: str, zone: str, node_name: str, reason: str = "PREEMPTED",
                       log_id: str = SYSTEM_EVENT_LOG_ID) -> dict:
    """One entry per lost TPU node: resourceName names the node, metadata.terminateReason the cause. Which log
    carries it is unverified (gcp-facts §2): `log_id` plays another one."""
    now = datetime.now(timezone.utc)
    method = "tpu.nodes.terminate"
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "tpu.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/{project}/locations/{zone}/nodes/{node_name}",
            "metadata": {"@type": "type.googleapis.com/google.cloud.tpu.v2.TerminateNodeMetadata", "terminateReason": reason},
        },
        "insertId": _insert_id(),
        "resource": {"type": "audited_resource",
                     "labels": {"service": "tpu.googleapis.com", "method": method, "project_id": project}},
        "timestamp": _ts(now),
        "severity": "NOTICE",
        "logName": log_name(project, log_id),
        "operation": _system_operation(method, int(time.time() * 1000)),
        "receiveTimestamp": _ts(now + timedelta(milliseconds=450)),
    }


def activity(method: str, *, project: str, resource_name: str, service: str = "compute.googleapis.com",
             principal: str = "respawn-controller@respawn.iam.gserviceaccount.com") -> dict:
    """A user API call (Admin Activity log); never selected by the sink filter."""
    now = datetime.now(timezone.utc)
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "authenticationInfo": {"principalEmail": principal},
            "serviceName": service,
            "methodName": method,
            "resourceName": resource_name,
        },
        "insertId": _insert_id(),
        "resource": {"type": "gce_instance" if service.startswith("compute") else "audited_resource",
                     "labels": {"project_id": project}},
        "timestamp": _ts(now),
        "severity": "NOTICE",
        "logName": log_name(project, "cloudaudit.googleapis.com/activity"),
        "receiveTimestamp": _ts(now + timedelta(milliseconds=300)),
    }
