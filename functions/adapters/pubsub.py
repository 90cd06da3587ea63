"""Publishing to Pub/Sub: alerts to the alerts topic (a failure is logged and swallowed: alerts never block
recovery), and the sweep's fan-out of one message per job to the sweep topic."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

from respawn import logs
from respawn.contract import sweep_nudge

from ..settings import ControlSettings

PUBLISH_TIMEOUT = ControlSettings.alert_publish_timeout_seconds  # the default; Deps.default() passes the setting
SWEEP_PUBLISH_TIMEOUT = ControlSettings.sweep_publish_timeout_seconds


def _topic_path(clients, topic: str) -> str:
    return topic if topic.startswith("projects/") else f"projects/{clients.project}/topics/{topic}"


def publish_alert(clients, alert: dict[str, Any], topic: str | None, *, timeout: float = PUBLISH_TIMEOUT) -> bool:
    """Publish `alert` to `topic` (an id in the clients' project, or projects/P/topics/T; None: only logged)."""
    if topic is None:
        logs.warning("alert not published: RESPAWN_ALERTS_TOPIC is not set", alert=alert)
        return False
    path = _topic_path(clients, topic)
    try:
        future = clients.publisher().publish(path, json.dumps(alert, default=str).encode(), type=alert.get("type", ""),
                                             job_id=alert.get("job_id", ""))
        future.result(timeout=timeout)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure: log it and carry on with recovery
        logs.error(f"alert not published to {path}: {exc}; recovery continues", alert=alert)
        return False


def publish_sweep(clients, job_ids: Iterable[str], topic: str, *, swept_at: str,
                  timeout: float = SWEEP_PUBLISH_TIMEOUT) -> tuple[int, dict[str, str]]:
    """Publish {"task": "sweep", "job_id": J, "swept_at": swept_at} to `topic` for every job, all at once: the
    client batches them and sends the batches concurrently, and every future is awaited against one deadline. A job
    whose message was not published is only reported (the next sweep sends it again); the others are unaffected.
    Returns (published, {job id: why its message was not published})."""
    job_ids = list(job_ids)
    if not job_ids:
        return 0, {}  # nothing to send: no client is built (a project without jobs needs no Pub/Sub)
    path = _topic_path(clients, topic)
    try:
        publisher = clients.publisher()
    except Exception as exc:  # noqa: BLE001 - no client (credentials): nothing is sent, the orphan scan goes on
        return 0, {job_id: f"{type(exc).__name__}: {exc}" for job_id in job_ids}
    futures: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for job_id in job_ids:
        body = json.dumps({**sweep_nudge(job_id), "swept_at": swept_at}).encode()
        try:
            futures[job_id] = publisher.publish(path, body, task="sweep", job_id=job_id)
        except Exception as exc:  # noqa: BLE001 - refused before sending (a closed client, a bad path): this job only
            failed[job_id] = f"{type(exc).__name__}: {exc}"
    deadline = time.monotonic() + timeout
    for job_id, future in futures.items():
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - a batch's failure or the deadline: its jobs wait for the next sweep
            failed[job_id] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return len(futures) - sum(1 for j in futures if j in failed), failed
