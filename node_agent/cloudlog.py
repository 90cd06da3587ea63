"""Cloud Logging entries of this node's setup, trainer and agent lines, each labelled with the job, attempt, node and
rank (respawn.contract.log_labels), written by the agent itself: whatever logging agent the image has or lacks
(docs/gcp-facts.md §22), `labels.respawn_job="JOB"` finds every line of a job, the trainer's raw output too.

Logging v2 REST `entries.write`: POST {host}/v2/entries:write with one log per stream (projects/P/logs/respawn-STREAM),
the VM as the monitored resource (gce_instance: project_id, instance_id, zone) and the VM's service-account token
from the metadata server; host = RESPAWN_LOGGING_HOST (local runs: sim/ serves it), else
https://logging.googleapis.com. The node service account needs logging.logEntries.create (deploy/iam, respawnNode).

It follows the bucket's copy (logship.py sends each chunk there first, then here): the bucket keeps everything,
this is for searching. So a failed write is not retried: one WARNING per streak of failures, the lines stay in the
bucket. The agent's own JSON lines go as jsonPayload with their severity and labels; the other streams' lines as
textPayload, labelled with the agent's labels of the moment.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Optional

from respawn.logs import LABELS_FIELD, log

from . import _http
from .metadata import TRANSPORT_ERRORS, MetadataClient, MetadataError, ServiceAccountToken, TokenError

PRODUCTION_HOST = "https://logging.googleapis.com"
LOG_ID_PREFIX = "respawn-"  # projects/P/logs/respawn-{stream}
MAX_LINE = 64 * 1024  # an entry is at most 256 KB; a longer line is cut, the bucket keeps it whole
JSON_STREAM = "agent"  # the stream whose lines are the agent's JSON objects


class CloudLogError(Exception):
    """Cloud Logging answered, but did not take the entries."""


class CloudLog:
    """Writes lines of a stream as entries; `labels` gives the labels of the moment (respawn.logs.labels)."""

    def __init__(self, project: str, zone: str, md: MetadataClient, labels: Callable[[], Dict[str, str]], *,
                 host: Optional[str] = None, timeout: float = 10.0):
        self.project, self.zone, self.md, self.labels, self.timeout = project, zone, md, labels, timeout
        self.url = f"{(host or os.environ.get('RESPAWN_LOGGING_HOST') or PRODUCTION_HOST).rstrip('/')}/v2/entries:write"
        self._token = ServiceAccountToken(md)
        self._instance_id: Optional[str] = None
        self._failing = False

    def write(self, stream: str, data: bytes, timeout: Optional[float] = None) -> bool:
        """Write the lines of `data` as entries of the stream's log; False (logged once per streak) if they were not
        taken."""
        entries = self.entries(stream, data)
        if not entries:
            return True
        try:
            self._post(stream, entries, self.timeout if timeout is None else timeout)
        except (CloudLogError, TokenError, MetadataError, *TRANSPORT_ERRORS) as exc:
            if not self._failing:
                log("WARNING", "cannot write this node's lines to Cloud Logging; they are in the job's bucket "
                               "(`respawn jobs logs`). Check that the node service account holds "
                               "logging.logEntries.create (the build's respawnNode role)", url=self.url,
                    error=str(exc) or repr(exc))
            self._failing = True
            return False
        if self._failing:
            log("INFO", "writing to Cloud Logging again", stream=stream)
            self._failing = False
        return True

    def entries(self, stream: str, data: bytes) -> List[dict]:
        """The entries of `data`'s lines (blank ones skipped)."""
        now = self.labels()
        out = []
        for raw in data.decode("utf-8", errors="replace").splitlines():
            line = raw[:MAX_LINE]
            if not line.strip():
                continue
            entry = {"labels": dict(now)}
            parsed = _json_object(line) if stream == JSON_STREAM else None
            if parsed is None:
                entry["textPayload"] = line
            else:
                entry["labels"].update(parsed.pop(LABELS_FIELD, None) or {})
                entry["severity"] = str(parsed.pop("severity", "DEFAULT"))
                entry["jsonPayload"] = parsed
            out.append(entry)
        return out

    def _post(self, stream: str, entries: List[dict], timeout: float) -> None:
        if self._instance_id is None:
            self._instance_id = self.md.read("instance/id")[0].strip()
        body = {"logName": f"projects/{self.project}/logs/{LOG_ID_PREFIX}{stream}",
                "resource": {"type": "gce_instance", "labels": {"project_id": self.project, "zone": self.zone,
                                                                 "instance_id": self._instance_id}},
                "entries": entries, "partialSuccess": True}
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._token.get()}"}
        resp = _http.request("POST", self.url, body=json.dumps(body).encode(), headers=headers, timeout=timeout)
        if resp.status != 200:
            raise CloudLogError(f"entries.write answered HTTP {resp.status}: {resp.text().strip()[:300]}")


def _json_object(line: str) -> Optional[dict]:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
