"""The job store on Firestore (layout: respawn/schema.py): read what reconcile observes, commit decisions, record
zone refusals shared by every job; and what the `respawn` CLI and the demo do to jobs (register, list, describe,
events, cancel). The one way the control plane, the CLI and the demo reach Firestore (the node agent, standard
library only, writes its heartbeats over REST: respawn/agent/firestore_rest.py).

A decision is committed as one atomic write (status update + lifecycle event in a single Commit) with the
precondition that the job document is unchanged since it was observed (its update_time): an optimistic
transaction. A concurrent delivery that committed first, a user's cancel, anything written in between makes the
precondition fail; nothing is written and reconcile observes again. (Read-write transactions would hold locks
across the decision, and concurrent deliveries then wait on lock timeouts, as the emulator shows.)

`reads` and `writes` count the document operations this store made (a get is one read whether or not the document
exists, a query one per document returned and at least one): an upper bound on what Firestore bills. reconcile logs
them per invocation.
"""

from __future__ import annotations

import enum
import os
from datetime import datetime, timezone
from typing import Any, Iterable

from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from respawn.schema import (CAPACITY, EVENTS, JOBS, NODES, CapacityRecord, JobEvent, JobStatus, State,
                            capacity_doc_id)

ACTIVE_STATES = [s.value for s in State if not s.terminal]
# With the emulator any project id works; this one is the demo's.
EMULATOR_PROJECT = "respawn-local"


class StoreError(Exception):
    """A failure the user can act on (no credentials, no project, a Firestore call refused), said in one line."""


class JobExists(Exception):
    pass


class NoSuchJob(Exception):
    pass


class JobFinished(Exception):
    def __init__(self, state: State):
        super().__init__(state.value)
        self.state = state


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
        self.reads = 0
        self.writes = 0

    @classmethod
    def open(cls, project: str | None) -> "Store":
        """The store of `project` with Application Default Credentials, or the emulator's when
        FIRESTORE_EMULATOR_HOST is set. Raises StoreError saying what to do."""
        if os.environ.get("FIRESTORE_EMULATOR_HOST"):
            return cls(firestore.Client(project=project or EMULATOR_PROJECT))
        try:
            return cls(firestore.Client(project=project))
        except DefaultCredentialsError:
            raise StoreError("no Google Cloud credentials: run `gcloud auth application-default login`, "
                             "or set FIRESTORE_EMULATOR_HOST for a local emulator") from None
        except OSError as exc:  # e.g. no project could be determined
            raise StoreError(f"cannot reach Firestore: {exc}; pass --project") from None

    @property
    def project(self) -> str:
        return self.db.project

    @staticmethod
    def is_api_error(exc: BaseException) -> bool:
        """True for a refused or failed Firestore call (reported in one line, not as a traceback)."""
        return isinstance(exc, gexc.GoogleAPIError)

    # ---- what users do to jobs (the CLI, the demo) --------------------------------------------------------

    def register(self, job_id: str, spec: dict[str, Any], source: str = "") -> None:
        """Create jobs/{job_id} with `spec` as given (a spec that fails validation too, as a hand-written document
        may: the controller then marks the job INVALID naming the field), a PENDING status and a first event.
        Raises JobExists rather than overwrite."""
        ref = self.db.collection(JOBS).document(job_id)
        try:
            ref.create({
                "spec": spec,
                "status": JobStatus(updated_at=datetime.now(timezone.utc)).model_dump(),
                "cancel_requested": False,
                "created_at": firestore.SERVER_TIMESTAMP,
            })
        except (gexc.AlreadyExists, gexc.Conflict):
            raise JobExists(job_id) from None
        details = {"source": source} if source else {}
        ref.collection(EVENTS).add(JobEvent.new(None, State.PENDING, "registered", **details).model_dump())

    def job_document(self, job_id: str) -> dict[str, Any]:
        snap = self.db.collection(JOBS).document(job_id).get()
        if not snap.exists:
            raise NoSuchJob(job_id)
        return snap.to_dict() or {}

    def job_statuses(self) -> list[tuple[str, JobStatus]]:
        return [(snap.id, JobStatus.model_validate((snap.to_dict() or {}).get("status") or {}))
                for snap in self.db.collection(JOBS).stream()]

    def job_events(self, job_id: str, limit: int) -> list[JobEvent]:
        """The newest `limit` lifecycle events, oldest first. Raises NoSuchJob."""
        self.job_document(job_id)
        query = self.db.collection(JOBS).document(job_id).collection(EVENTS).order_by("at").limit_to_last(limit)
        return [JobEvent.model_validate(snap.to_dict()) for snap in query.get()]

    def request_cancel(self, job_id: str) -> State:
        """Set cancel_requested (the controller deletes the node and marks the job CANCELLED) and record the
        request as an event. Returns the state it was in; raises NoSuchJob or JobFinished."""
        ref = self.db.collection(JOBS).document(job_id)

        @firestore.transactional
        def request(txn) -> State:
            snap = ref.get(transaction=txn)
            if not snap.exists:
                raise NoSuchJob(job_id)
            state = JobStatus.model_validate((snap.to_dict() or {}).get("status") or {}).state
            if state.terminal:
                raise JobFinished(state)
            txn.update(ref, {"cancel_requested": True})
            return state

        state = request(self.db.transaction())
        ref.collection(EVENTS).add(JobEvent.new(state, state, "cancel requested").model_dump())
        return state

    # ---- what reconcile observes and records --------------------------------------------------------------

    def job(self, job_id: str) -> tuple[dict[str, Any], Any] | None:
        """(document, its update_time: the version a commit is conditional on), or None if there is no such job."""
        snap = self.db.collection(JOBS).document(job_id).get()
        self.reads += 1
        return (snap.to_dict(), snap.update_time) if snap.exists else None

    def heartbeat(self, node: str) -> dict[str, Any] | None:
        snap = self.db.collection(NODES).document(node).get()
        self.reads += 1
        return snap.to_dict() if snap.exists else None

    def blocked(self, zones: Iterable[str], accelerator: str) -> dict[str, datetime]:
        """zone → end of its capacity/quota cooldown for this accelerator (one batched read)."""
        refs = [self.db.collection(CAPACITY).document(capacity_doc_id(z, accelerator)) for z in zones]
        out = {}
        self.reads += len(refs)
        for snap in self.db.get_all(refs):
            if snap.exists:
                doc = snap.to_dict()
                if isinstance(doc.get("until"), datetime):
                    out[doc.get("zone") or snap.id.split("~")[0]] = doc["until"]
        return out

    def commit(self, job_id: str, version: Any, status: dict[str, Any], event: JobEvent | None) -> bool:
        """Write the new status (and its lifecycle event) atomically iff the job document is still at `version`."""
        ref = self.db.collection(JOBS).document(job_id)
        batch = self.db.batch()
        batch.update(ref, {"status": _plain(status)}, option=self.db.write_option(last_update_time=version))
        if event is not None:
            batch.set(ref.collection(EVENTS).document(), _plain(event.model_dump()))
        try:
            batch.commit()
        except (gexc.FailedPrecondition, gexc.NotFound, gexc.Aborted, gexc.Conflict):
            return False
        self.writes += 1 if event is None else 2
        return True

    def record_capacity(self, record: CapacityRecord) -> None:
        ref = self.db.collection(CAPACITY).document(capacity_doc_id(record.zone, record.accelerator_type))
        ref.set(_plain(record.model_dump()))
        self.writes += 1

    def active_jobs(self) -> list[str]:
        """Every job the sweep must look at (single-field `in` query: Firestore's automatic index)."""
        query = self.db.collection(JOBS).where(filter=FieldFilter("status.state", "in", ACTIVE_STATES))
        return self._counted([snap.id for snap in query.select(["status.state"]).stream()])

    def all_jobs(self) -> dict[str, dict[str, Any]]:
        """job id → {"spec": {"zones", "accelerator.kind"}, "status": {...}} for the orphan scan."""
        query = self.db.collection(JOBS).select(["spec.zones", "spec.accelerator.kind", "status"])
        return self._counted({snap.id: snap.to_dict() for snap in query.stream()})

    def jobs_in_zone(self, zone: str) -> list[tuple[str, dict[str, Any]]]:
        """The one indexed lookup for a TPU worker VM event: jobs whose current node is in `zone`."""
        query = self.db.collection(JOBS).where(filter=FieldFilter("status.zone", "==", zone))
        return self._counted([(snap.id, snap.to_dict()) for snap in query.stream()])

    def _counted(self, results):
        self.reads += max(1, len(results))
        return results
