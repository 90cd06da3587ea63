"""The job's goodput in Cloud Monitoring (functions/goodput_metrics.py): timeSeries.create over the REST API (an
authorized session from respawn.control.clients; local runs: sim/ at RESPAWN_MONITORING_ENDPOINT). Written when a
job recovers and when it ends (reconcile), best effort: a failure is one WARNING and changes nothing else. The job's
events and heartbeats are read through the controller's own store (adapters/firestore_store.py).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from respawn.deployment import heartbeat_database
from respawn.schema import JobSpec

from .. import goodput, goodput_metrics, placement
from .firestore_store import Store
from .jsonapi import checked

PRODUCTION = "https://monitoring.googleapis.com"
TIMEOUT_S = 30


class MonitoringApi:
    def __init__(self, session: Any, endpoint: str | None = None):
        self.session = session
        self.base = f"{(endpoint or PRODUCTION).rstrip('/')}/v3"

    def create_time_series(self, project: str, series: list[dict[str, Any]]) -> None:
        for i in range(0, len(series), goodput_metrics.MAX_SERIES_PER_REQUEST):
            url = f"{self.base}/projects/{project}/timeSeries"
            r = self.session.request("POST", url, json={
                "timeSeries": series[i:i + goodput_metrics.MAX_SERIES_PER_REQUEST]}, timeout=TIMEOUT_S)
            checked(r, "POST", url)


def write_goodput(clients: Any, project: str, job_id: str, spec: JobSpec, endpoint: str | None = None
                  ) -> list[dict[str, Any]]:
    """Read the job (its document, events and heartbeats), reckon its goodput (goodput.py) and post it; the series
    posted."""
    store = Store(clients.firestore(), clients.firestore_database)
    found = store.job(job_id)
    if found is None:
        return []
    doc, _ = found
    events = store.events(job_id)
    beats = store.heartbeats(job_id, heartbeat_database(store.identity_of(job_id)))
    now = datetime.now(timezone.utc)
    status, started, ended = goodput.window(doc, events, now)
    lives, _ = goodput.lives(events, beats)
    location = status.zone or (spec.zones[0] if spec.zones else "global")
    series = goodput_metrics.time_series(job_id, location, placement.accelerator_key(spec),
                                         goodput.buckets(started, ended, lives), (ended - started).total_seconds(),
                                         len(goodput.recoveries(lives, events)), now)
    clients.monitoring(endpoint).create_time_series(project, series)
    return series

