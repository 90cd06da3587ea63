"""Cloud Monitoring's timeSeries.create (REST v3), as much as Respawn's controller writes: each TimeSeries with a
metric type and labels, a monitored resource, and one point with an end time and one typed value; what breaks that
is 400 INVALID_ARGUMENT naming the series, as the API answers. What was written stays in `series`, in order, for
tests to read."""

from __future__ import annotations

import threading
from typing import Any

from sim.core import compute_error

VALUE_KEYS = ("doubleValue", "int64Value", "boolValue", "stringValue", "distributionValue")


class Monitoring:
    def __init__(self) -> None:
        self.series: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def create(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        series = body.get("timeSeries")
        if not isinstance(series, list) or not series or len(series) > 200:
            raise compute_error(400, "badRequest", "timeSeries: between 1 and 200 time series per request")
        for i, ts in enumerate(series):
            metric, resource, points = ts.get("metric") or {}, ts.get("resource") or {}, ts.get("points") or []
            problem = ("metric.type is required" if not metric.get("type") else
                       "resource.type is required" if not resource.get("type") else
                       "exactly one point is required" if len(points) != 1 else
                       "points[0].interval.endTime is required" if not (points[0].get("interval") or {}).get("endTime")
                       else "points[0].value needs one typed value"
                       if sum(k in (points[0].get("value") or {}) for k in VALUE_KEYS) != 1 else None)
            if problem:
                raise compute_error(400, "badRequest", f"Field timeSeries[{i}]: {problem}")
        with self._lock:
            self.series.extend({**ts, "project": project} for ts in series)
        return {}
