"""Decode a Cloud Audit Logs LogEntry (as routed by the Logging sink) into a Signal: which node, in which zone,
and what happened to it. Pure: no cloud library, no I/O.

Anything that is not one of the routed system events, or does not name a node, decodes to None; the entry point
logs it and acknowledges the message (a malformed entry must never cause a retry storm).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from respawn import audit
from respawn.schema import parse_node_name

# methodName (the routed set, respawn/audit.py) -> the cause recorded on the job (gcp-facts §1 and §2).
CAUSES = {
    audit.PREEMPTED: "preempted",
    audit.HOST_ERROR: "host_error",
    audit.GUEST_TERMINATE: "guest_terminate",
    audit.TERMINATE_ON_HOST_MAINTENANCE: "host_maintenance",
    audit.TPU_NODE_TERMINATE: "tpu_terminated",
}
assert set(CAUSES) == set(audit.METHODS), "respawn/audit.py routes a method functions/events.py does not decode"
# Resource names: Compute Engine `projects/P/zones/Z/instances/N`; Cloud TPU `projects/P/locations/Z/nodes/N`.
_INSTANCE = re.compile(r"(?:^|/)projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")
_TPU_NODE = re.compile(r"(?:^|/)projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)/nodes/(?P<name>[^/]+)$")
# A Cloud TPU's worker VMs are Compute Engine instances named `t1v-n-<hash>-w-<i>`: not our node name.
TPU_WORKER = re.compile(r"^t1v-n-[0-9a-f]+-w-[0-9]+$")


@dataclass(frozen=True)
class Signal:
    zone: str
    node: str  # the resource's own name: a Respawn node name, or a TPU worker VM name
    cause: str
    method: str
    project: str | None = None
    job_id: str | None = None  # from the node name; None for a TPU worker VM (the caller looks the job up)
    attempt: int | None = None
    detail: str = ""  # status message / TPU terminateReason, for the event record
    at: datetime | None = None  # the entry's timestamp: a hint older than the node's (re)start is stale

    @property
    def tpu_worker(self) -> bool:
        return self.job_id is None


class Undecodable(ValueError):
    """The entry is not a node-loss event Respawn acts on; the message says why (for the log line)."""


def decode(entry: Any) -> Signal:
    """LogEntry dict → Signal, or raise Undecodable naming what was missing."""
    if not isinstance(entry, dict):
        raise Undecodable(f"a LogEntry is a JSON object, got {type(entry).__name__}")
    payload = entry.get("protoPayload")
    if not isinstance(payload, dict):
        raise Undecodable("no protoPayload: not an audit log entry")
    method = payload.get("methodName")
    if method not in CAUSES:
        raise Undecodable(f"methodName {method!r} is not a node-loss event")
    resource_name = payload.get("resourceName")
    if not isinstance(resource_name, str):
        raise Undecodable(f"{method}: no resourceName")
    match = _INSTANCE.search(resource_name) or _TPU_NODE.search(resource_name)
    if not match:
        raise Undecodable(f"{method}: resourceName {resource_name!r} names no instance or TPU node")
    zone, name = match["zone"], match["name"]
    labels = (entry.get("resource") or {}).get("labels") or {}
    if isinstance(labels, dict) and labels.get("zone") and labels["zone"] != zone:
        raise Undecodable(f"{method}: resource zone {labels['zone']!r} contradicts resourceName zone {zone!r}")
    detail = ""
    metadata = payload.get("metadata")
    if isinstance(metadata, dict) and metadata.get("terminateReason"):
        detail = str(metadata["terminateReason"])
    elif isinstance(payload.get("status"), dict):
        detail = str(payload["status"].get("message") or "")
    if TPU_WORKER.match(name):
        job_id, attempt = None, None  # the caller finds the job with one indexed lookup (see find_jobs)
    else:
        parsed = parse_node_name(name)
        if parsed is None or parsed[1] < 1:
            raise Undecodable(f"{method}: node {name!r} in {zone} is not a Respawn node name")
        job_id, attempt = parsed
    return Signal(
        zone=zone, node=name, cause=CAUSES[method], method=method, project=match["project"],
        job_id=job_id, attempt=attempt, detail=detail, at=_timestamp(entry.get("timestamp")),
    )


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value.replace("Z", "+00:00")
    # fromisoformat takes at most 6 fractional digits; Cloud Logging writes up to 9.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
