"""Writing a job document the way a user registers one: `jobs/{id}` with the spec, a PENDING status and a first
event. Shared by the CLI and the demo."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from respawn import schema


class JobExists(Exception):
    pass


def register(db, spec: schema.JobSpec, source: str = "") -> None:
    """Create jobs/{spec.id}; raise JobExists rather than overwrite."""
    write_document(db, spec.id, spec.to_doc(), source)


def write_document(db, job_id: str, spec: dict[str, Any], source: str = "") -> None:
    """Create jobs/{job_id} with `spec` as given — also a spec that fails validation, as a hand-written document
    may; the controller then marks the job INVALID with a message naming the field."""
    from google.api_core.exceptions import AlreadyExists, Conflict
    from google.cloud import firestore

    ref = db.collection(schema.JOBS).document(job_id)
    try:
        ref.create({
            "spec": spec,
            "status": schema.JobStatus(updated_at=datetime.now(timezone.utc)).model_dump(),
            "cancel_requested": False,
            "created_at": firestore.SERVER_TIMESTAMP,
        })
    except (AlreadyExists, Conflict):
        raise JobExists(job_id) from None
    details = {"source": source} if source else {}
    ref.collection(schema.EVENTS).add(schema.JobEvent.new(None, schema.State.PENDING, "registered", **details).model_dump())
