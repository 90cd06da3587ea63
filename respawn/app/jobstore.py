"""What users do to jobs in Firestore (layout: respawn/schema.py), with their own credentials: register, list,
describe, events, cancel (and the cancel's nudge to the controller's sweep topic). The `respawn` CLI and the demo use it; it is the CLI's adapter, as
respawn.control.adapters.firestore_store is the controller's (each runs as its own identity, with its own IAM)."""

from __future__ import annotations

import functools
import json
import os
from datetime import datetime, timezone
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from respawn.contract import sweep_nudge
from respawn import deployment
from respawn.schema import (CAPACITY, EVENTS, IDENTITIES, JOBS, NODES, STATS, Heartbeat, JobEvent, JobStatus, State,
                            capacity_doc_id)

from . import endpoints

# With the emulator any project id works; this one is the demo's.
EMULATOR_PROJECT = "respawn-local"
# Each call's own deadline, retries included (the library's default retries UNAVAILABLE for 300 s): an endpoint that
# answered the probe (respawn.app.endpoints) but stops answering still ends the command within 10 s, naming it.
RPC_DEADLINE_S = endpoints.CALL_DEADLINE_S
RPC = {"retry": retries.Retry(predicate=retries.if_transient_error, initial=0.25, maximum=2.0,
                              timeout=RPC_DEADLINE_S),
       "timeout": RPC_DEADLINE_S}
# Writes that must not land on a job that ended: read, then update on the condition that the document is still the
# one read (its update_time), again if it changed meanwhile; each call with its deadline (a transaction's begin and
# commit take none).
WRITE_TRIES = 5


class StoreError(Exception):
    """A failure the user can act on (no credentials, no project), said in one line."""


class JobExists(Exception):
    pass


class NoSuchJob(Exception):
    pass


class JobFinished(Exception):
    def __init__(self, state: State):
        super().__init__(state.value)
        self.state = state


def is_api_error(exc: BaseException) -> bool:
    """True for a refused or failed Firestore call (reported in one line, not as a traceback)."""
    return isinstance(exc, gexc.GoogleAPIError)


def is_unanswered(exc: BaseException) -> bool:
    """True for a call that got no answer in time (a deadline, retries given up, the endpoint unavailable)."""
    return isinstance(exc, (gexc.RetryError, gexc.DeadlineExceeded, gexc.ServiceUnavailable))


def _told(method):
    """A JobStore call, with a progress line on stderr while it is slow (respawn.app.endpoints.waiting)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with endpoints.waiting(self.where):
            return method(self, *args, **kwargs)
    return call


class JobStore:
    def __init__(self, db: firestore.Client):
        self.db = db
        self.where = endpoints.where(endpoints.FIRESTORE, db.project)

    @classmethod
    def open(cls, project: str | None) -> "JobStore":
        """The store of `project` with Application Default Credentials, or the emulator's when
        FIRESTORE_EMULATOR_HOST is set, once its endpoint answers (respawn.app.endpoints.check). Raises StoreError
        saying what to do."""
        try:
            if os.environ.get("FIRESTORE_EMULATOR_HOST"):
                endpoints.check(endpoints.FIRESTORE)
                return cls(firestore.Client(project=project or EMULATOR_PROJECT))
            db = firestore.Client(project=project)
            endpoints.check(endpoints.FIRESTORE, db.project)
            return cls(db)
        except endpoints.Unreachable as exc:
            raise StoreError(str(exc)) from None
        except DefaultCredentialsError:
            raise StoreError("no Google Cloud credentials: run `gcloud auth application-default login`, "
                             "or set FIRESTORE_EMULATOR_HOST for a local emulator") from None
        except OSError as exc:  # e.g. no project could be determined
            raise StoreError(f"cannot reach Firestore: {exc}; pass --project") from None

    @property
    def project(self) -> str:
        return self.db.project

    @_told
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
            }, **RPC)
        except (gexc.AlreadyExists, gexc.Conflict):
            raise JobExists(job_id) from None
        details = {"source": source} if source else {}
        ref.collection(EVENTS).add(JobEvent.new(None, State.PENDING, "registered", **details).model_dump(), **RPC)

    @_told
    def job_document(self, job_id: str) -> dict[str, Any]:
        """Raises NoSuchJob."""
        snap = self.db.collection(JOBS).document(job_id).get(**RPC)
        if not snap.exists:
            raise NoSuchJob(job_id)
        return snap.to_dict() or {}

    @_told
    def job_statuses(self) -> list[tuple[str, JobStatus]]:
        return [(snap.id, JobStatus.model_validate((snap.to_dict() or {}).get("status") or {}))
                for snap in self.db.collection(JOBS).stream(**RPC)]

    @_told
    def job_events(self, job_id: str, limit: int) -> list[JobEvent]:
        """The newest `limit` lifecycle events, oldest first. Raises NoSuchJob."""
        self.job_document(job_id)
        query = self.db.collection(JOBS).document(job_id).collection(EVENTS).order_by("at").limit_to_last(limit)
        return [JobEvent.model_validate(snap.to_dict()) for snap in query.get(**RPC)]

    @_told
    def all_events(self, job_id: str) -> list[JobEvent]:
        """Every lifecycle event still kept (schema.EVENT_RETENTION), oldest first. Raises NoSuchJob."""
        self.job_document(job_id)
        query = self.db.collection(JOBS).document(job_id).collection(EVENTS).order_by("at")
        return [JobEvent.model_validate(snap.to_dict()) for snap in query.stream(**RPC)]

    @_told
    def heartbeat_database(self, job_id: str) -> str:
        """Where the job's nodes beat: its node identity's database while it holds one, else the deployment's
        default (docs/architecture.md, isolation between jobs)."""
        leases = self.db.collection(IDENTITIES).where(filter=FieldFilter("job_id", "==", job_id)).limit(1).stream(**RPC)
        lease = next(iter(leases), None)
        return deployment.heartbeat_database(lease.id if lease is not None else None)

    @_told
    def heartbeats(self, job_id: str, database: str) -> dict[str, Heartbeat]:
        """node → its last heartbeat (a multi-host slice: its worker 0's), from `database`."""
        db = firestore.Client(project=self.db.project, database=database)
        try:
            query = db.collection(NODES).where(filter=FieldFilter("job_id", "==", job_id))
            beats = [(snap.id, snap.to_dict() or {}) for snap in query.stream(**RPC)]
        finally:
            db.close()
        return {node: Heartbeat.model_validate(doc) for node, doc in beats if int(doc.get("worker") or 0) == 0}

    @_told
    def capacity_records(self, zones: list[str], accelerator: str) -> dict[str, dict[str, Any]]:
        """zone → its capacity/{zone}~{accelerator} document (the cooldown, and the statistics by model)."""
        refs = [self.db.collection(CAPACITY).document(capacity_doc_id(z, accelerator)) for z in zones]
        got = self.db.get_all(refs, retry=None, timeout=RPC_DEADLINE_S)  # only adds to what is shown: no retries
        return {(s.to_dict().get("zone") or s.id.split("~")[0]): s.to_dict() for s in got if s.exists}

    @_told
    def stats_of(self, accelerator: str) -> list[dict[str, Any]]:
        """Every zone's statistics of `accelerator`, by provisioning model (capacity/*.stats; one indexed query)."""
        query = self.db.collection(CAPACITY).where(filter=FieldFilter("accelerator_type", "==", accelerator))
        return [doc[STATS] for doc in (s.to_dict() for s in query.stream(**RPC)) if doc.get(STATS)]

    @_told
    def request_cancel(self, job_id: str) -> State:
        """Set cancel_requested (the controller deletes the node and marks the job CANCELLED) and record the
        request as an event. Returns the state it was in; raises NoSuchJob or JobFinished."""
        state = self._update_active(job_id, {"cancel_requested": True}).state
        self._event(job_id, JobEvent.new(state, state, "cancel requested"))
        return state

    def _update_active(self, job_id: str, fields: dict[str, Any], also: tuple[State, ...] = ()) -> JobStatus:
        """Write `fields` into the job's document in one transaction unless it is terminal (but for the states in
        `also`); returns the status it had. Raises NoSuchJob or JobFinished."""
        ref = self.db.collection(JOBS).document(job_id)
        for _ in range(WRITE_TRIES):
            snap = ref.get(**RPC)
            if not snap.exists:
                raise NoSuchJob(job_id)
            status = JobStatus.model_validate((snap.to_dict() or {}).get("status") or {})
            if status.state.terminal and status.state not in also:
                raise JobFinished(status.state)
            try:
                ref.update(fields, option=self.db.write_option(last_update_time=snap.update_time), **RPC)
                return status
            except gexc.FailedPrecondition:
                continue  # the controller wrote it meanwhile: read it again
        raise StoreError(f"jobs/{job_id} changed {WRITE_TRIES} times while being written; retry")

    def _event(self, job_id: str, event: JobEvent) -> None:
        self.db.collection(JOBS).document(job_id).collection(EVENTS).add(event.model_dump(), **RPC)


    @_told
    def set_budget(self, job_id: str, max_usd: float) -> JobStatus:
        """Set the job's spec.budget.max_usd (the controller resumes a BUDGET_EXHAUSTED job whose cost is below
        it) and record it as an event. Returns the status it had; raises NoSuchJob, or JobFinished for a job ended
        otherwise than by its budget."""
        status = self._update_active(job_id, {"spec.budget": {"max_usd": max_usd}}, also=(State.BUDGET_EXHAUSTED,))
        self._event(job_id, JobEvent.new(status.state, status.state, "budget set", max_usd=max_usd))
        return status


def nudge_sweep(project: str, topic: str, job_id: str, timeout: float = endpoints.CALL_DEADLINE_S) -> None:
    """Publish {"task": "sweep", "job_id": …} to the sweep topic, so that the controller acts on the job now."""
    from google.cloud import pubsub_v1

    endpoints.check(endpoints.PUBSUB, project)  # raises Unreachable in seconds, not after `timeout` of retries
    publisher = pubsub_v1.PublisherClient()
    data = json.dumps(sweep_nudge(job_id)).encode()
    publisher.publish(publisher.topic_path(project, topic), data).result(timeout=timeout)
