"""Wake the controller when this node fails or is about to go: one Pub/Sub message to its sweep topic.

A trainer that exits with an error of its own, or a failed setup, is written to the heartbeat; the control plane
reads heartbeats when something wakes it (an audit event, the scheduled sweep every 2 minutes). Nothing else wakes
it for a failure that loses no VM, so a multi-node job would wait for the next sweep to restart its members. After
the heartbeat saying so has been written, the agent publishes respawn.contract.sweep_nudge(job) to
NodeSettings.sweep_topic: on_sweep reconciles that one job at once. On a preemption or maintenance notice the agent
publishes respawn.contract.notice_nudge(job, node, notice, at) at once, without waiting for a heartbeat: the
controller may create the replacement while this node saves its emergency checkpoint. Nothing is sent while all is
well, so the path costs nothing while idle.

The heartbeat stays the truth and the sweep the fallback: a publish that fails is logged once (WARNING) and never
retried. Pub/Sub REST (v1 `projects.topics.publish`, docs/gcp-facts.md §5): POST
https://pubsub.googleapis.com/v1/projects/P/topics/T:publish with {"messages": [{"data": BASE64}]} and the VM's
service-account token from the metadata server; with PUBSUB_EMULATOR_HOST set (local runs) http://HOST/v1/… with
no token. The node service account needs pubsub.topics.publish on that topic (deploy/iam/permissions.yaml).
"""

from __future__ import annotations

import base64
import json
import os
import threading
from typing import Callable, Optional

from respawn import contract
from respawn.logs import log

from . import _http
from .metadata import TRANSPORT_ERRORS, MetadataClient, ServiceAccountToken, TokenError

PRODUCTION_ROOT = "https://pubsub.googleapis.com/v1/"
PUBLISH_TIMEOUT_S = 5.0  # one try, short: the scheduled sweep finds the failure anyway


class Nudger:
    """Publishes sweep_nudge(job_id) to the sweep topic, in a thread of its own (`nudge`), at most once per
    failure the agent reports."""

    def __init__(self, project: str, topic: str, job_id: str, md: MetadataClient | None = None, *,
                 emulator_host: str | None = None, timeout: float = PUBLISH_TIMEOUT_S):
        emulator_host = emulator_host if emulator_host is not None else os.environ.get("PUBSUB_EMULATOR_HOST")
        self.topic = contract.topic_path(project, topic)
        self.job_id, self.timeout = job_id, timeout
        self.root = f"http://{emulator_host}/v1/" if emulator_host else PRODUCTION_ROOT
        self._token = None if emulator_host else ServiceAccountToken(md or MetadataClient())

    def nudge(self, why: str, before: Optional[Callable[[], object]] = None,
              message: Optional[dict] = None) -> threading.Thread:
        """Publish `message` (default: the job's sweep nudge) in the background; `before` (optional) runs first in
        that thread (waiting for the heartbeat)."""
        thread = threading.Thread(target=self._run, args=(why, before, message), name="sweep-nudge", daemon=True)
        thread.start()
        return thread

    def _run(self, why: str, before: Optional[Callable[[], object]], message: Optional[dict]) -> None:
        if before is not None:
            before()
        try:
            self.publish(message)
        except (NudgeError, TokenError, *TRANSPORT_ERRORS) as exc:
            log("WARNING", f"could not wake the controller through {self.topic}; it acts on this node's heartbeat at "
                           "its next scheduled sweep instead. Check that the topic exists and that the node service "
                           "account holds pubsub.topics.publish on it (roles/pubsub.publisher, or the build's "
                           "respawnNodeSweep role)", topic=self.topic, why=why, error=str(exc) or repr(exc))
            return
        log("INFO", "controller woken: sweep requested for this job", topic=self.topic, why=why)

    def publish(self, message: Optional[dict] = None) -> str:
        """One publish of `message` (default: the job's sweep nudge); returns the message id. Raises NudgeError on
        an HTTP error, TokenError without a token, TRANSPORT_ERRORS on a dead link."""
        body = message if message is not None else contract.sweep_nudge(self.job_id)
        data = base64.b64encode(json.dumps(body).encode()).decode()
        headers = {"Content-Type": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.get()}"
        resp = _http.request("POST", f"{self.root}{self.topic}:publish", headers=headers, timeout=self.timeout,
                             body=json.dumps({"messages": [{"data": data}]}).encode())
        if resp.status != 200:
            raise NudgeError(f"publish answered HTTP {resp.status}: {resp.text().strip()[:300]}")
        try:
            return json.loads(resp.body)["messageIds"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise NudgeError(f"publish answered without a message id: {resp.text()[:300]}") from None


class NudgeError(Exception):
    """Pub/Sub answered, but not with a published message."""
