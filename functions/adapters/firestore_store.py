"""The job store on Firestore (layout: respawn/schema.py): read what reconcile observes, commit decisions in a
transaction guarded by the status revision, record zone refusals shared by every job.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Iterable

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from respawn.schema import CAPACITY, EVENTS, JOBS, NODES, CapacityRecord, JobEvent, State, capacity_doc_id

ACTIVE_STATES = [s.value for s in State if not s.terminal]


def _plain(value: Any) -> Any:
    """Pydantic python-mode dumps keep enums; Firestore wants their values."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Store:
    def __init__(self, db: firestore.Client):
        self.db = db

    def job(self, job_id: str) -> dict[str, Any] | None:
        snap = self.db.collection(JOBS).document(job_id).get()
        return snap.to_dict() if snap.exists else None

    def heartbeat(self, node: str) -> dict[str, Any] | None:
        snap = self.db.collection(NODES).document(node).get()
        return snap.to_dict() if snap.exists else None

    def blocked(self, zones: Iterable[str], accelerator: str) -> dict[str, datetime]:
        """zone → end of its capacity/quota cooldown for this accelerator (one batched read)."""
        refs = [self.db.collection(CAPACITY).document(capacity_doc_id(z, accelerator)) for z in zones]
        out = {}
        for snap in self.db.get_all(refs):
            if snap.exists:
                doc = snap.to_dict()
                if isinstance(doc.get("until"), datetime):
                    out[doc.get("zone") or snap.id.split("~")[0]] = doc["until"]
        return out

    def commit(self, job_id: str, expected_revision: int, status: dict[str, Any], event: JobEvent | None) -> bool:
        """Write the new status (and its lifecycle event) iff nobody changed the status since it was observed."""
        ref = self.db.collection(JOBS).document(job_id)
        event_ref = ref.collection(EVENTS).document()

        @firestore.transactional
        def run(transaction) -> bool:
            snap = ref.get(transaction=transaction)
            if not snap.exists:
                return False
            current = (snap.to_dict().get("status") or {}).get("revision", 0)
            if current != expected_revision:
                return False
            transaction.update(ref, {"status": _plain(status)})
            if event is not None:
                transaction.set(event_ref, _plain(event.model_dump()))
            return True

        return run(self.db.transaction())

    def record_capacity(self, record: CapacityRecord) -> None:
        ref = self.db.collection(CAPACITY).document(capacity_doc_id(record.zone, record.accelerator_type))
        ref.set(_plain(record.model_dump()))

    def active_jobs(self) -> list[str]:
        """Every job the sweep must look at (single-field `in` query: Firestore's automatic index)."""
        query = self.db.collection(JOBS).where(filter=FieldFilter("status.state", "in", ACTIVE_STATES))
        return [snap.id for snap in query.select(["status.state"]).stream()]

    def jobs_in_zone(self, zone: str) -> list[tuple[str, dict[str, Any]]]:
        """The one indexed lookup for a TPU worker VM event: jobs whose current node is in `zone`."""
        query = self.db.collection(JOBS).where(filter=FieldFilter("status.zone", "==", zone))
        return [(snap.id, snap.to_dict()) for snap in query.stream()]
