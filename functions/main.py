"""Cloud Functions (2nd gen) entry points. Each parses its trigger and hands over to the core; nothing else.

    on_job_created  Firestore document created (jobs/{job}), Eventarc CloudEvent with protobuf DocumentEventData
    on_log_event    Pub/Sub: the Logging sink's audit LogEntry (system events: preemption, host error, TPU terminate)
    on_sweep        Pub/Sub: Cloud Scheduler's {"task": "sweep"} (or the CLI's {"task": "sweep", "job_id": ID})
    on_alert        Pub/Sub: an alert JSON → Slack

Malformed or foreign payloads are logged and acknowledged; transient failures of our own dependencies raise, so the
platform (deployed with --retry) redelivers. Importing this module loads no Google client library.
"""

from __future__ import annotations

import functions_framework

from respawn import logs
# Absolute, unlike the package's other imports: the Functions Framework loads this file by its path (the deployed
# source's main.py, the tests' functions/main.py), outside the package.
from respawn.control import handlers, triggers


@functions_framework.cloud_event
def on_job_created(cloud_event) -> None:
    try:
        job_id = triggers.firestore_job_id(cloud_event.data, cloud_event.get_attributes())
    except triggers.Malformed as exc:
        logs.warning(f"on_job_created: event ignored: {exc}", event_id=cloud_event["id"])
        return
    handlers.job_created(job_id)


def _pubsub(cloud_event, name: str, handle) -> None:
    try:
        body = triggers.pubsub_json(cloud_event.data)
    except triggers.Malformed as exc:
        logs.warning(f"{name}: message ignored: {exc}", event_id=cloud_event["id"])
        return
    handle(body)


@functions_framework.cloud_event
def on_log_event(cloud_event) -> None:
    _pubsub(cloud_event, "on_log_event", handlers.log_event)


@functions_framework.cloud_event
def on_sweep(cloud_event) -> None:
    _pubsub(cloud_event, "on_sweep", handlers.sweep)


@functions_framework.cloud_event
def on_alert(cloud_event) -> None:
    _pubsub(cloud_event, "on_alert", handlers.alert)
