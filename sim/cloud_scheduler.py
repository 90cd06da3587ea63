"""Cloud Scheduler's jobs (REST v1: jobs.get, jobs.pause, jobs.resume), for the jobs this process plays.

The scheduler itself is sim/bridges.py's SweepScheduler, which is made apart from any SimServer (the demo and the
tests start it after the sim): its job registers here when it starts and leaves when it stops, so a deleted job is a
stopped scheduler. Every SimServer of the process serves the jobs of its own project from this registry, as Cloud
Scheduler answers `gcloud scheduler jobs describe|pause|resume` and `respawn doctor`. A paused job does not tick.

The job's schedule is the deployment's (respawn.deployment.SWEEP_SCHEDULE, what the build's `scheduler` step
sets); its ticks come every `interval` wall seconds of the SweepScheduler (the stand-ins' compressed time).
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass, field

from respawn import deployment
from sim.core import rfc3339, rpc_error

ENABLED, PAUSED = "ENABLED", "PAUSED"


@dataclass
class SchedulerJob:
    """One Pub/Sub-target job, as `gcloud scheduler jobs create pubsub` makes it."""

    name: str  # projects/P/locations/L/jobs/J
    topic: str  # projects/P/topics/T
    data: bytes
    schedule: str = deployment.SWEEP_SCHEDULE
    time_zone: str = "Etc/UTC"
    state: str = ENABLED
    updated: float = field(default_factory=time.time)

    def resource(self) -> dict:
        """The Job as jobs.get answers it."""
        return {"name": self.name, "schedule": self.schedule, "timeZone": self.time_zone, "state": self.state,
                "pubsubTarget": {"topicName": self.topic, "data": base64.b64encode(self.data).decode()},
                "userUpdateTime": rfc3339(self.updated), "attemptDeadline": "180s"}


def job_name(project: str, region: str, job: str = deployment.SCHEDULER_JOB) -> str:
    return f"projects/{project}/locations/{region}/jobs/{job}"


_jobs: dict[str, SchedulerJob] = {}
_lock = threading.Lock()


def register(job: SchedulerJob) -> None:
    with _lock:
        _jobs[job.name] = job


def unregister(job: SchedulerJob) -> None:
    with _lock:
        if _jobs.get(job.name) is job:
            del _jobs[job.name]


class CloudScheduler:
    """What a SimServer serves: the registered jobs of its project."""

    def __init__(self, project: str) -> None:
        self.project = project

    def _job(self, location: str, job: str) -> SchedulerJob:
        with _lock:
            found = _jobs.get(job_name(self.project, location, job))
        if found is None:
            raise rpc_error(404, f"Job not found: {job_name(self.project, location, job)}.")
        return found

    def get(self, location: str, job: str) -> dict:
        return self._job(location, job).resource()

    def set_state(self, location: str, job: str, state: str) -> dict:
        found = self._job(location, job)
        found.state, found.updated = state, time.time()
        return found.resource()

