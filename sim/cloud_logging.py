"""Cloud Logging's entries.write (REST v2), as much as the node agent writes (node_agent/cloudlog.py): a default
logName (projects/P/logs/LOG_ID) and monitored resource, and entries each with one payload (textPayload or
jsonPayload) and string labels; what breaks that is 400 INVALID_ARGUMENT naming the entry, as the API answers.
Each entry then goes to the `sink` (an AuditRouter), as Logging passes every entry through the project's sinks.
What was written stays in `entries` (each with its logName, resource and labels filled in from the request's
defaults, as the API does), in order, for tests to read.

LogSink: the deployment's Logging sink as a resource (projects.sinks.get, update, delete), in front of the router
that plays its routing (SimServer's `audit_sink`): made as the build's `sink` step makes it (respawn.deployment.SINK,
respawn.audit.sink_filter, the router's topic), it passes every entry on to the router while it exists, is enabled,
keeps that filter and that destination. Changed or deleted, it routes nothing: the router evaluates respawn.audit's
filter only, and publishes to its own topic only."""

from __future__ import annotations

import re
import threading
import time
import zlib
from typing import Any, Callable

from respawn import audit, deployment
from sim.core import compute_error, rfc3339, rpc_error

LOG_NAME = re.compile(r"^projects/[^/]+/logs/[^/]{1,512}$")
PAYLOADS = ("textPayload", "jsonPayload", "protoPayload")


class CloudLogging:
    def __init__(self, sink: Callable[[dict], None] | None = None) -> None:
        self.sink = sink
        self.sink_errors: list[str] = []  # a routed entry the sink could not deliver (its topic gone)
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def write(self, body: dict[str, Any]) -> dict[str, Any]:
        entries = body.get("entries")
        if not isinstance(entries, list) or not entries:
            raise compute_error(400, "badRequest", "entries: at least one log entry is required")
        filled = []
        for i, entry in enumerate(entries):
            log_name = entry.get("logName") or body.get("logName") or ""
            resource = entry.get("resource") or body.get("resource") or {}
            labels = {**(body.get("labels") or {}), **(entry.get("labels") or {})}
            problem = ("logName must be projects/PROJECT/logs/LOG_ID" if not LOG_NAME.match(log_name) else
                       "resource.type is required" if not resource.get("type") else
                       "exactly one payload is required" if sum(k in entry for k in PAYLOADS) != 1 else
                       "label values must be strings" if not all(isinstance(v, str) for v in labels.values())
                       else None)
            if problem:
                raise compute_error(400, "badRequest", f"Field entries[{i}]: {problem}")
            filled.append({**entry, "logName": log_name, "resource": resource, "labels": labels})
        with self._lock:
            self.entries.extend(filled)
        for entry in filled if self.sink is not None else ():
            try:
                self.sink(entry)
            except Exception as exc:  # noqa: BLE001 - Logging tells the writer nothing of a sink's failure
                self.sink_errors.append(f"{type(exc).__name__}: {exc}")
        return {}


SINK_FIELDS = ("destination", "filter", "description", "disabled", "includeChildren")  # what update may change


class LogSink:
    def __init__(self, project: str, router: Callable[[dict], None]) -> None:
        self.project, self.router, self.filter = project, router, audit.sink_filter(project)
        topic = getattr(router, "topic_path", None) or f"projects/{project}/topics/{deployment.LOG_EVENTS_TOPIC}"
        self.routes_to = f"pubsub.googleapis.com/{topic}"
        number = zlib.crc32(project.encode()) % 10**12  # the sim's projects have no number: one of its own
        self.writer = f"serviceAccount:service-{number}@gcp-sa-logging.iam.gserviceaccount.com"
        self.resource: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self.create({"name": deployment.SINK, "destination": self.routes_to, "filter": self.filter})

    def __call__(self, entry: dict) -> None:
        with self._lock:
            sink = self.resource
        if (sink is not None and not sink.get("disabled") and sink.get("destination") == self.routes_to
                and sink.get("filter") == self.filter):
            self.router(entry)

    def _found(self, name: str) -> dict[str, Any]:
        if self.resource is None or name != self.resource["name"]:
            raise rpc_error(404, f"Sink {name} does not exist")
        return self.resource

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """projects.sinks.create (this project's one sink: the deployment's)."""
        missing = [f for f in ("name", "destination") if not body.get(f)]
        if missing:
            raise rpc_error(400, f"LogSink.{missing[0]} is required")
        unknown = [f for f in body if f not in ("name", *SINK_FIELDS)]
        if unknown:
            raise rpc_error(400, f"LogSink fields this sim does not take: {', '.join(unknown)}")
        with self._lock:
            if self.resource is not None:
                raise rpc_error(409, f"Sink {self.resource['name']} already exists", "ALREADY_EXISTS")
            now = rfc3339(time.time())
            self.resource = {**body, "writerIdentity": self.writer, "createTime": now, "updateTime": now}
            return dict(self.resource)

    def get(self, name: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._found(name))

    def update(self, name: str, body: dict[str, Any], update_mask: str | None) -> dict[str, Any]:
        """projects.sinks.update: the fields the mask names (without one, destination and filter, as the API does)."""
        fields = [f.strip() for f in update_mask.split(",")] if update_mask else ["destination", "filter"]
        unknown = [f for f in fields if f not in SINK_FIELDS]
        if unknown:
            raise rpc_error(400, f"update_mask names fields this sink cannot change here: {', '.join(unknown)}")
        with self._lock:
            sink = self._found(name)
            for f in fields:
                if f in body:
                    sink[f] = body[f]
                else:
                    sink.pop(f, None)
            sink["updateTime"] = rfc3339(time.time())
            return dict(sink)

    def delete(self, name: str) -> dict[str, Any]:
        with self._lock:
            self._found(name)
            self.resource = None
        return {}

