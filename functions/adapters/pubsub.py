"""Publishing alerts to the alerts topic. A failure is logged and swallowed: alerts never block recovery."""

from __future__ import annotations

import json
import os
from typing import Any

from respawn import logs

PUBLISH_TIMEOUT = float(os.environ.get("RESPAWN_ALERT_PUBLISH_TIMEOUT_SECONDS", "10"))


def alerts_topic() -> str | None:
    return os.environ.get("RESPAWN_ALERTS_TOPIC") or None


def publish_alert(clients, alert: dict[str, Any]) -> bool:
    topic = alerts_topic()
    if topic is None:
        logs.warning("alert not published: RESPAWN_ALERTS_TOPIC is not set", alert=alert)
        return False
    path = topic if topic.startswith("projects/") else f"projects/{clients.project}/topics/{topic}"
    try:
        future = clients.publisher().publish(path, json.dumps(alert, default=str).encode(), type=alert.get("type", ""),
                                             job_id=alert.get("job_id", ""))
        future.result(timeout=PUBLISH_TIMEOUT)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure: log it and carry on with recovery
        logs.error(f"alert not published to {path}: {exc}; recovery continues", alert=alert)
        return False
