"""Parsing the triggers' payloads: Pub/Sub CloudEvents and Eventarc's Firestore document-created CloudEvent.
Anything malformed raises Malformed (the entry point logs it and acknowledges: a retry could not fix it)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Mapping

from respawn.schema import JOBS


class Malformed(ValueError):
    pass


def pubsub_json(data: Any) -> Any:
    """A Pub/Sub CloudEvent's data {"message": {"data": base64, ...}, "subscription": ...} → the decoded JSON body."""
    if not isinstance(data, Mapping) or not isinstance(data.get("message"), Mapping):
        raise Malformed("not a Pub/Sub CloudEvent: data has no 'message' object")
    raw = data["message"].get("data")
    if not raw:
        raise Malformed("the Pub/Sub message has no data")
    try:
        body = base64.b64decode(raw, validate=True)
        return json.loads(body)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise Malformed(f"the Pub/Sub message data is not base64 JSON: {exc}") from None


def _job_from_path(path: str) -> str | None:
    parts = path.strip("/").split("/")
    if "documents" in parts:
        parts = parts[parts.index("documents") + 1:]
    if len(parts) == 2 and parts[0] == JOBS and parts[1]:
        return parts[1]
    return None


def firestore_job_id(data: Any, attributes: Mapping[str, Any]) -> str:
    """The job id of a google.cloud.firestore.document.v1.created event: from the protobuf DocumentEventData's
    value.name (projects/P/databases/D/documents/jobs/ID), else from the `document` attribute (jobs/ID)."""
    if isinstance(data, (bytes, bytearray)) and data:
        from google.events.cloud import firestore as firestore_events  # protobuf types; only this trigger needs them

        try:
            event = firestore_events.DocumentEventData.deserialize(bytes(data))
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise Malformed(f"Firestore event data is not a DocumentEventData protobuf: {exc}") from None
        job = _job_from_path(event.value.name)
        if job:
            return job
    document = attributes.get("document")
    if isinstance(document, str):
        job = _job_from_path(document)
        if job:
            return job
    raise Malformed(f"the Firestore event names no jobs/{{job}} document (document={document!r})")
