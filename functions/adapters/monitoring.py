"""The job's goodput in Cloud Monitoring (functions/goodput_metrics.py): timeSeries.create over the REST API (an
authorized session from respawn.control.clients; local runs: sim/ at RESPAWN_MONITORING_ENDPOINT). Written when a
job recovers and when it ends (reconcile), best effort: a failure is one WARNING and changes nothing else.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from respawn import report
from respawn.control import goodput_metrics, placement
from respawn.control.adapters.jsonapi import checked
from respawn.jobstore import JobStore
from respawn.schema import JobSpec

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
    """Read the job's report (its events and heartbeats, respawn/report.py) and post its goodput; the series
    posted."""
    r, doc, _ = report.load(JobStore(clients.firestore()), job_id)
    status = doc.get("status") or {}
    location = status.get("zone") or (spec.zones[0] if spec.zones else "global")
    series = goodput_metrics.time_series(job_id, location, placement.accelerator_key(spec), r.goodput,
                                         r.wall_seconds, len(r.recoveries), datetime.now(timezone.utc))
    clients.monitoring(endpoint).create_time_series(project, series)
    return series

