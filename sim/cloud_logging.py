"""Cloud Logging's entries.write (REST v2), as much as the node agent writes (node_agent/cloudlog.py): a default
logName (projects/P/logs/LOG_ID) and monitored resource, and entries each with one payload (textPayload or
jsonPayload) and string labels; what breaks that is 400 INVALID_ARGUMENT naming the entry, as the API answers.
Each entry then goes to the `sink` (an AuditRouter), as Logging passes every entry through the project's sinks.
What was written stays in `entries` (each with its logName, resource and labels filled in from the request's
defaults, as the API does), in order, for tests to read."""

from __future__ import annotations

import re
import threading
from typing import Any, Callable

from sim.core import compute_error

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
