"""The deployment's self-test: a probe sent down every path Respawn relies on, each acknowledged by the function at
its end (docs/deploy.md, "The self-test").

The single definition of the probes' shapes and of their acknowledgements, read by the functions (which acknowledge),
by `respawn doctor` and the build's last step (which send and wait: respawn/app/selftest_run.py), and by the sink's
filter (respawn/audit.py admits the probe's log). Imports nothing beyond the standard library.

Acknowledgements are documents of their own Firestore database (DATABASE), never beside the jobs: the notifier may
write there (an IAM condition on that database) and nowhere else in Firestore.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

DATABASE = "respawn-selftest"
COLLECTION = "probes"  # probes/{probe}: one field per link, {"at": epoch seconds, "detail": text}
TICKS = "sweep-ticks"  # probes/sweep-ticks: the scheduler's latest tick, written by on_sweep on every tick
LOG_ID = "respawn-selftest"  # the probe's log; the sink's filter admits it beside the audit events
JOB_PREFIX = "respawn-selftest-"  # the probe job's ID: acknowledged by on_job_created, never reconciled
ALERT_TYPE = "selftest"  # the probe alert's type: on_alert posts "Respawn is deployed" to Slack and acknowledges
_PROBE = re.compile(r"^[a-z0-9]{8,32}$")


@dataclass(frozen=True)
class Link:
    key: str  # the acknowledgement's field
    function: str  # the entry point at the link's end
    path: str  # what the probe travels, for the report
    cause: str  # what to check when it does not answer


LOG_EVENT = Link("log_event", "on_log_event", "a log entry → the Logging sink → Pub/Sub → on_log_event",
                 "the sink respawn-system-events must route the probe's log to respawn-log-events (its filter holds "
                 "the probe clause: redeploy), its writer identity needs roles/pubsub.publisher on that topic, and "
                 "respawn-on-log-event must be deployed with its trigger")
SWEEP = Link("sweep", "on_sweep", "a Cloud Scheduler tick → Pub/Sub → on_sweep",
             "the scheduler job respawn-sweep must exist, be enabled and publish to respawn-sweep, and "
             "respawn-on-sweep must be deployed with its trigger")
JOB_CREATED = Link("job_created", "on_job_created", "a job document → Eventarc → on_job_created",
                   "respawn-on-job-created must be deployed with its Firestore trigger on the (default) database; "
                   "the trigger identity needs roles/eventarc.eventReceiver")
ALERT = Link("alert", "on_alert", "an alert → Pub/Sub → on_alert",
             "respawn-on-alert must be deployed with its trigger on respawn-alerts; in a project that enabled "
             "Pub/Sub on or before 2021-04-08 the Pub/Sub service agent needs roles/iam.serviceAccountTokenCreator")
LINKS: tuple[Link, ...] = (LOG_EVENT, SWEEP, JOB_CREATED, ALERT)

# on_alert's word on Slack, in the alert link's acknowledgement.
SLACK_SENT = "sent to Slack"
SLACK_UNSET = "Slack is not configured"
SLACK_DEPLOYED = "Respawn is deployed: every path of this deployment answered its self-test"


def new_probe() -> str:
    return uuid.uuid4().hex[:16]


def valid_probe(probe: object) -> bool:
    return isinstance(probe, str) and bool(_PROBE.match(probe))


def probe_job_id(probe: str) -> str:
    return JOB_PREFIX + probe


def probe_of_job(job_id: str) -> str | None:
    """The probe a job ID carries, or None for a real job."""
    probe = job_id[len(JOB_PREFIX):] if job_id.startswith(JOB_PREFIX) else None
    return probe if valid_probe(probe) else None


def log_name(project: str) -> str:
    return f"projects/{project}/logs/{LOG_ID}"


def probe_entry(project: str, probe: str) -> dict:
    """The LogEntry the self-test writes: the sink routes it as it routes an audit event."""
    return {"logName": log_name(project), "resource": {"type": "global", "labels": {"project_id": project}},
            "jsonPayload": {"selftest": probe, "message": "Respawn self-test probe"}, "severity": "NOTICE"}


def probe_of_entry(entry: object) -> str | None:
    """The probe a routed LogEntry carries, or None for any other entry (the sink routes this project's only)."""
    if not isinstance(entry, dict) or not str(entry.get("logName", "")).endswith(f"/logs/{LOG_ID}"):
        return None
    probe = (entry.get("jsonPayload") or {}).get("selftest")
    return probe if valid_probe(probe) else None


def probe_alert(probe: str) -> dict:
    return {"type": ALERT_TYPE, "probe": probe}


def probe_of_alert(message: object) -> str | None:
    if not isinstance(message, dict) or message.get("type") != ALERT_TYPE:
        return None
    probe = message.get("probe")
    return probe if valid_probe(probe) else None
