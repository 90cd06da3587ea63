"""The job store on Firestore (layout: respawn/schema.py): read what reconcile observes, commit decisions, record
zone refusals shared by every job.

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
from datetime import datetime
from typing import Any, Callable, Iterable

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from respawn.schema import (ADVICE, CAPACITY, EVENTS, IDENTITIES, JOBS, NODES, NODES_DATABASE, AdviceRecord,
                            STATS, CapacityRecord, Heartbeat, JobEvent, State, capacity_doc_id)

from ..placement import pool_key

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
    def __init__(self, db: firestore.Client, nodes_db: Callable[[str], firestore.Client]):
        self.db = db  # jobs, their events, capacity records, node identity leases
        self.nodes_db = nodes_db  # database id → its client: the heartbeats (deployment.heartbeat_database)
        self.reads = 0
        self.writes = 0

    def job(self, job_id: str) -> tuple[dict[str, Any], Any] | None:
        """(document, its update_time: the version a commit is conditional on), or None if there is no such job."""
        snap = self.db.collection(JOBS).document(job_id).get()
        self.reads += 1
        return (snap.to_dict(), snap.update_time) if snap.exists else None

    def heartbeat(self, node: str, database: str = NODES_DATABASE) -> dict[str, Any] | None:
        snap = self.nodes_db(database).collection(NODES).document(node).get()
        self.reads += 1
        return snap.to_dict() if snap.exists else None

    def events(self, job_id: str) -> list[JobEvent]:
        """Every lifecycle event of the job still kept (schema.EVENT_RETENTION), oldest first."""
        query = self.db.collection(JOBS).document(job_id).collection(EVENTS).order_by("at")
        return self._counted([JobEvent.model_validate(snap.to_dict()) for snap in query.stream()])

    def heartbeats(self, job_id: str, database: str) -> dict[str, Heartbeat]:
        """node → the last heartbeat of each of the job's nodes in `database` (a multi-host slice: its worker 0's)."""
        query = self.nodes_db(database).collection(NODES).where(filter=FieldFilter("job_id", "==", job_id))
        docs = self._counted([(snap.id, snap.to_dict() or {}) for snap in query.stream()])
        return {node: Heartbeat.model_validate(doc) for node, doc in docs if int(doc.get("worker") or 0) == 0}

    def blocked(self, zones: Iterable[str], accelerator: str) -> dict[str, datetime]:
        """The capacity/quota cooldowns for this accelerator (one batched read): placement.pool_key(zone, pool) →
        its end for one capacity pool, zone → its end for all (a record written by an older version)."""
        refs = [self.db.collection(CAPACITY).document(capacity_doc_id(z, accelerator)) for z in zones]
        out = {}
        self.reads += len(refs)
        for snap in self.db.get_all(refs):
            if snap.exists:
                doc = snap.to_dict()
                zone = doc.get("zone") or snap.id.split("~")[0]
                pools = doc.get("until_by_pool")
                if isinstance(pools, dict):
                    out.update({pool_key(zone, p): t for p, t in pools.items() if isinstance(t, datetime)})
                elif isinstance(doc.get("until"), datetime):
                    out[zone] = doc["until"]
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
        # One document per zone and accelerator; each pool's cooldown merged into it, so a Spot stockout does not
        # end a flex-start one. `until` stays for readers of an older version (a cooldown for every pool).
        by_pool = {pool: record.until for pool in record.pools}
        ref.set({**_plain(record.model_dump()), "until_by_pool": by_pool}, merge=True)
        self.writes += 1

    def record_stats(self, zone: str, accelerator: str, model: str, counts: dict[str, float]) -> None:
        """Add `counts` to the zone's statistics for `model` (increments: concurrent jobs never lose each other's)."""
        ref = self.db.collection(CAPACITY).document(capacity_doc_id(zone, accelerator))
        ref.set({"zone": zone, "accelerator_type": accelerator,
                 STATS: {model: {k: firestore.Increment(v) for k, v in counts.items()}}}, merge=True)
        self.writes += 1

    def zone_advice(self, zones: Iterable[str], shape: str) -> dict[str, AdviceRecord]:
        """zone → the capacity advice cached for `shape` there (one batched read; stale records included)."""
        refs = [self.db.collection(ADVICE).document(capacity_doc_id(z, shape)) for z in zones]
        self.reads += len(refs)
        return {r.zone: r for r in (AdviceRecord.model_validate(s.to_dict()) for s in self.db.get_all(refs) if s.exists)}

    def record_advice(self, record: AdviceRecord) -> None:
        self.db.collection(ADVICE).document(capacity_doc_id(record.zone, record.shape)).set(_plain(record.model_dump()))
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

    def leases(self) -> dict[str, tuple[str, str | None, Any]]:
        """identity → (the job holding it, the folder it was granted, the lease's version)."""
        snaps = list(self.db.collection(IDENTITIES).stream())
        self.reads += max(1, len(snaps))
        docs = {s.id: (s.to_dict() or {}, s.update_time) for s in snaps}
        return {i: (d.get("job_id", ""), d.get("folder"), version) for i, (d, version) in docs.items()}

    def lease(self, identity: str, job_id: str, folder: str | None) -> bool:
        """Take `identity` for `job_id` iff no job holds it (an atomic create); False: another lease exists."""
        self.writes += 1
        try:
            self.db.collection(IDENTITIES).document(identity).create(
                {"job_id": job_id, "folder": folder, "leased_at": firestore.SERVER_TIMESTAMP})
        except (gexc.AlreadyExists, gexc.Conflict):
            return False
        return True

    def identity_of(self, job_id: str) -> str | None:
        """The node identity `job_id` holds, if any (one indexed query)."""
        query = self.db.collection(IDENTITIES).where(filter=FieldFilter("job_id", "==", job_id)).limit(1)
        snaps = self._counted(list(query.stream()))
        return snaps[0].id if snaps else None

    def release(self, identity: str, version: Any) -> bool:
        """End the lease iff it is still the one read at `version`; False: it changed meanwhile."""
        self.writes += 1
        try:
            self.db.collection(IDENTITIES).document(identity).delete(
                option=self.db.write_option(last_update_time=version))
        except (gexc.FailedPrecondition, gexc.NotFound, gexc.Aborted, gexc.Conflict):
            return False
        return True

    def _counted(self, results):
        self.reads += max(1, len(results))
        return results
