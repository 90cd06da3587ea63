"""Publishing alerts to the alerts topic. A failure is logged and swallowed: alerts never block recovery."""

from __future__ import annotations

import json
from typing import Any

from respawn import logs
from respawn.control.settings import ControlSettings

PUBLISH_TIMEOUT = ControlSettings.alert_publish_timeout_seconds  # the default; Deps.default() passes the setting


def publish_alert(clients, alert: dict[str, Any], topic: str | None, *, timeout: float = PUBLISH_TIMEOUT) -> bool:
    """Publish `alert` to `topic` (an id in the clients' project, or projects/P/topics/T; None: only logged)."""
    if topic is None:
        logs.warning("alert not published: RESPAWN_ALERTS_TOPIC is not set", alert=alert)
        return False
    path = topic if topic.startswith("projects/") else f"projects/{clients.project}/topics/{topic}"
    try:
        future = clients.publisher().publish(path, json.dumps(alert, default=str).encode(), type=alert.get("type", ""),
                                             job_id=alert.get("job_id", ""))
        future.result(timeout=timeout)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure: log it and carry on with recovery
        logs.error(f"alert not published to {path}: {exc}; recovery continues", alert=alert)
        return False
