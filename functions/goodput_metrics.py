"""A job's goodput (goodput.py) as Cloud Monitoring time series, in the metric types Google's own
ml-goodput-measurement writes from a workload (docs/gcp-facts.md §25), so that what reads those (Metrics Explorer's
Workload resource, the build's dashboard: deploy/monitoring/goodput-dashboard.json) reads Respawn's figures without
code in the trainer. Pure: the adapter (adapters/monitoring.py) posts what this builds.

Every value is a GAUGE of the job's total so far (seconds, or a count), on the monitored resource
compute.googleapis.com/Workload {location, workload_id: the job, replica_id: "0"}.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

GOODPUT_TIME = "compute.googleapis.com/workload/goodput_time"  # label goodput_source: TOTAL
BADPUT_TIME = "compute.googleapis.com/workload/badput_time"  # label badput_source: a BadputType name
ELAPSED_TIME = "compute.googleapis.com/workload/total_elapsed_time"
DISRUPTIONS = "compute.googleapis.com/workload/disruptions"
RESOURCE = "compute.googleapis.com/Workload"
# goodput.BUCKETS (productive_training aside) → ml-goodput-measurement's BadputType names.
BADPUT_SOURCES = {
    "wasted_progress_from_disruption": "WASTED_PROGRESS_FROM_DISRUPTION",
    "infrastructure_recovery_from_disruption": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "program_startup": "PROGRAM_STARTUP",
    "training_prep": "TRAINING_PREP",
    "other": "OTHER",
}
MAX_SERIES_PER_REQUEST = 200  # timeSeries.create's limit


def time_series(job_id: str, location: str, accelerator: str, buckets: dict[str, float], wall_seconds: float,
                disruptions: int, at: datetime) -> list[dict[str, Any]]:
    """The TimeSeries objects (REST JSON) of one write: goodput, each badput source, the elapsed time and the
    disruptions, each one point at `at`."""
    resource = {"type": RESOURCE, "labels": {"location": location, "workload_id": job_id, "replica_id": "0"}}
    end = at.isoformat().replace("+00:00", "Z")

    def one(metric: str, labels: dict[str, str], value: float | int) -> dict[str, Any]:
        typed = {"int64Value": str(int(value))} if isinstance(value, int) else {"doubleValue": float(value)}
        return {"metric": {"type": metric, "labels": labels}, "resource": resource, "metricKind": "GAUGE",
                "valueType": "INT64" if isinstance(value, int) else "DOUBLE",
                "points": [{"interval": {"endTime": end}, "value": typed}]}

    base = {"accelerator_type": accelerator}
    out = [one(GOODPUT_TIME, {**base, "goodput_source": "TOTAL"}, float(buckets.get("productive_training", 0.0)))]
    out += [one(BADPUT_TIME, {**base, "badput_source": source}, float(buckets.get(bucket, 0.0)))
            for bucket, source in BADPUT_SOURCES.items()]
    cumulative = {**base, "window_type": "CUMULATIVE"}  # as ml-goodput-measurement labels these two
    out.append(one(ELAPSED_TIME, cumulative, float(wall_seconds)))
    out.append(one(DISRUPTIONS, cumulative, int(disruptions)))
    return out
