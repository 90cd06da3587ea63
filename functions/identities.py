"""Which service account a job's nodes run as: one identity of the deployment's pool (respawn.deployment
node_identities, RESPAWN_NODE_IDENTITIES), leased to one job at a time, and granted that job's checkpoint folder
only.

A node can then read and write its own job's checkpoints and nothing of another job's (docs/architecture.md,
"Isolation between jobs"). The lease is a document identities/{email} created atomically, so two jobs never hold one
identity, and two deliveries for the same job agree on one. A lease ends only when its job is over and none of the
job's nodes is left (a node still running as the identity would otherwise reach the next job's folder); that is
checked when the pool runs dry, so a lost release costs nothing but a later look.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from respawn import logs
from respawn.contract import StoreUri
from respawn.schema import JobSpec, JobStatus, State

from .ports import ControlStore, FolderGrants, Jobs


class NoIdentity(RuntimeError):
    """Every identity of the pool is held by a job still running: this job waits for one (the platform retries the
    delivery, and the sweep looks again)."""


def checkpoint_folder(spec: JobSpec) -> str | None:
    """The managed folder the job's identity is granted: its checkpoint_uri as gs://BUCKET/PREFIX/ (None for a
    local file:// run, which has no IAM)."""
    uri = StoreUri.parse(spec.checkpoint_uri)
    return str(uri).rstrip("/") + "/" if uri.scheme == StoreUri.GS else None


def identity_for(job_id: str, spec: JobSpec, pool: tuple[str, ...], store: ControlStore, grants: FolderGrants,
                 nodes_left: Callable[[dict[str, Any] | None], bool]) -> str | None:
    """The identity the job's next node runs as, its folder granted; None when the deployment has no pool (local
    runs: the project's default service account). `nodes_left(job document)`: whether any node a finished job's
    document names still exists. Raises NoIdentity when every identity is held by a job still running."""
    if not pool:
        return None
    folder = checkpoint_folder(spec)
    leases = store.leases()
    for identity, (holder, _, _) in leases.items():
        if holder == job_id and identity in pool:
            return _granted(grants, folder, identity)
    for identity in pool:
        if identity not in leases:
            if store.lease(identity, job_id, folder):
                logs.info(f"job {job_id} runs as {identity}", job_id=job_id, identity=identity)
                return _granted(grants, folder, identity)
            if store.leases().get(identity, ("",))[0] == job_id:  # a concurrent delivery for this job took it
                return _granted(grants, folder, identity)
    for identity, (holder, old_folder, version) in leases.items():
        if identity not in pool or not _over(store, holder, nodes_left):
            continue
        if old_folder:
            grants.revoke(old_folder, identity)  # before anyone else can run as it
        if store.release(identity, version) and store.lease(identity, job_id, folder):
            logs.info(f"job {job_id} runs as {identity} (job {holder} is over)", job_id=job_id, identity=identity)
            return _granted(grants, folder, identity)
    holders = sorted({h for h, _, _ in leases.values()})
    message = (f"all {len(pool)} node identities are held by running jobs ({', '.join(holders)}): job {job_id} starts "
               "when one of them ends; to run more jobs at once, deploy again with a larger _NODE_IDENTITIES "
               "(docs/deploy.md)")
    logs.warning(message, job_id=job_id)
    raise NoIdentity(message)


def _granted(grants: FolderGrants, folder: str | None, identity: str) -> str:
    if folder is not None:
        grants.grant(folder, identity)
    return identity


def _over(store: Jobs, job_id: str, nodes_left: Callable[[dict[str, Any] | None], bool]) -> bool:
    """The job is gone or terminal, and none of its nodes exists."""
    found = store.job(job_id)
    doc = found[0] if found else None
    if doc is not None and not State(JobStatus.model_validate(doc.get("status") or {}).state).terminal:
        return False
    return not nodes_left(doc)


def known_nodes(doc: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(zone, node) of every node a job document names: its current node, and each member's."""
    if not doc:
        return []
    status = JobStatus.model_validate(doc.get("status") or {})
    return [(s.zone, s.node) for s in (status, *status.members) if s.zone and s.node]
