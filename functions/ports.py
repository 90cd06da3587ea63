"""The ports the control plane talks through: what reconcile and the handlers need from the job store and from a
node provider, as typed Protocols. Pure: no Google client and no adapter is imported here; the adapters
(adapters/firestore_store.Store, adapters/compute.ComputeProvider, adapters/tpu.TpuProvider) satisfy them
structurally, and tests may hand reconcile anything else that does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

from respawn.contract import Handover
from respawn.images import ImageCheck
from respawn.advice import Shape, ZoneAdvice
from respawn.prices import Book
from respawn.schema import AdviceRecord, CapacityRecord, JobEvent, JobSpec


class Jobs(Protocol):
    """The job documents: read one, commit its status, list them (the sweep, the orphan scan, a TPU worker's
    event)."""

    reads: int  # document reads made so far (reconcile logs the difference per invocation)
    writes: int  # document writes made so far

    def job(self, job_id: str) -> tuple[dict[str, Any], Any] | None:
        """(the job document, its version: what a commit is conditional on), or None when there is no such job."""
        ...

    def commit(self, job_id: str, version: Any, status: dict[str, Any], event: JobEvent | None) -> bool:
        """Write `status` (and `event`) atomically iff the job is still at `version`; False: it changed meanwhile."""
        ...

    def active_jobs(self) -> list[str]:
        """The ids of the jobs in a non-terminal state (the sweep)."""
        ...

    def all_jobs(self) -> dict[str, dict[str, Any]]:
        """job id → {"spec": {"zones", "accelerator.kind"}, "status": {...}} (the orphan scan)."""
        ...

    def jobs_in_zone(self, zone: str) -> list[tuple[str, dict[str, Any]]]:
        """(job id, document) of the jobs whose current node is in `zone` (a TPU worker VM's event)."""
        ...


class Heartbeats(Protocol):
    """What the nodes' agents write."""

    def heartbeat(self, node: str, database: str) -> dict[str, Any] | None:
        """nodes/{node} in `database` (deployment.heartbeat_database of the job's identity) as the agent wrote it,
        or None."""
        ...


class CapacityRecords(Protocol):
    """The zones' refusals and what every job saw of them, shared by the jobs that ask for the same accelerator."""

    def blocked(self, zones: Iterable[str], accelerator: str) -> Mapping[str, datetime]:
        """zone → the end of its capacity/quota cooldown for `accelerator`."""
        ...

    def record_capacity(self, record: CapacityRecord) -> None:
        """Record a zone's refusal for every job that asks for the same accelerator."""
        ...

    def record_stats(self, zone: str, accelerator: str, model: str, counts: dict[str, float]) -> None:
        """Add `counts` (schema.ZoneStats fields) to what every job saw of `model` nodes of `accelerator` in
        `zone` (functions/stats.py)."""
        ...


class AdviceCache(Protocol):
    """Compute Engine's capacity advice, cached for every job."""

    def zone_advice(self, zones: Iterable[str], shape: str) -> Mapping[str, AdviceRecord]:
        """zone → the capacity advice cached for the machine shape `shape` (respawn.advice.Shape.key), stale or not."""
        ...

    def record_advice(self, record: AdviceRecord) -> None:
        """Cache one zone × shape's advice (or why there is none) for every job."""
        ...


class IdentityLeases(Protocol):
    """The node identities of the pool, each leased to one job at a time (identities.py)."""

    def leases(self) -> Mapping[str, tuple[str, str | None, Any]]:
        """Node identity → (the job holding it, the checkpoint folder it was granted, the lease's version)."""
        ...

    def lease(self, identity: str, job_id: str, folder: str | None) -> bool:
        """Take `identity` for `job_id` iff no job holds it; False: another lease exists (maybe the job's own)."""
        ...

    def release(self, identity: str, version: Any) -> bool:
        """End the lease iff it is still at `version`."""
        ...

    def identity_of(self, job_id: str) -> str | None:
        """The node identity `job_id` holds, if any."""
        ...


@runtime_checkable
class ControlStore(Jobs, Heartbeats, CapacityRecords, AdviceCache, IdentityLeases, Protocol):
    """Everything reconcile needs of the store, as one adapter serves it (adapters/firestore_store.Store; layout:
    respawn/schema.py). A part that needs less names the port of its concern."""


@runtime_checkable
class AdviceSource(Protocol):
    """Compute Engine's capacity advice (docs/gcp-facts.md §20)."""

    def capacity(self, zone: str, shape: Shape, size: int) -> ZoneAdvice | None:
        """The scores of `size` Spot VMs of `shape` in `zone` (None: the answer has none for it); raises the
        client's exception."""
        ...


@runtime_checkable
class PriceSource(Protocol):
    """Unit prices of a region (respawn.prices.Book; the Cloud Billing Catalog, gcp-facts §24)."""

    def book(self, region: str, now: datetime) -> Book:
        """The region's price book: the catalog's (cached), else a fallback whose `note` says which. Never raises
        for a catalog that cannot be read."""
        ...


@runtime_checkable
class FolderGrants(Protocol):
    """Who may use the objects of a checkpoint folder (a Cloud Storage managed folder's IAM policy)."""

    def grant(self, folder: str, member: str) -> None:
        """Let `member` (an email) read, write and delete the objects under `folder` (gs://BUCKET/PREFIX/);
        creates the managed folder when missing. Idempotent; raises the client's exception."""
        ...

    def revoke(self, folder: str, member: str) -> None:
        """Take that back (a missing folder or binding is nothing to revoke)."""
        ...


@runtime_checkable
class NodeProvider(Protocol):
    """GPU VMs (Compute Engine) or TPU VMs (Cloud TPU). Every call is idempotent in effect; a refusal raises the
    client library's own exception, which placement.classify reads."""

    kind: str  # "gpu" | "tpu": the key in reconcile.Deps.providers

    def get(self, zone: str, name: str) -> str | None:
        """The API's state string for the node, or None when it does not exist."""
        ...

    def list_labelled(self, zone: str) -> list[tuple[str, dict[str, str]]]:
        """(name, labels) of every node in `zone` that carries the respawn-job label."""
        ...

    def check_image(self, spec: JobSpec) -> ImageCheck | None:
        """Whether the image the node would boot exists (asked once, on the job's first handling); None: the node
        has no image to check (TPU VMs boot a runtime version). Never raises: a check that cannot be made answers
        ImageVerdict.UNCHECKED."""
        ...

    def create(self, spec: JobSpec, zone: str, name: str, attempt: int, provisioning: str, startup_script: str,
               slot: int = 0, service_account: str | None = None, handover: Handover | None = None) -> bool:
        """Create the node and wait for the operation. True: created; False: it already existed (409), adopted.
        `slot`: the member slot of a job of several nodes (a label; TPU jobs are one node). `service_account`: the
        identity it runs as (None: the project's default). `handover`: the node it replaces during a notice."""
        ...

    def start(self, zone: str, name: str) -> None:
        """Start a stopped node again (a restart in place) and wait for the operation."""
        ...

    def console_tail(self, zone: str, name: str, chars: int) -> str | None:
        """About the last `chars` characters of the node's serial console (a boot that never reported: what it
        printed); None when the provider has no console for its nodes. Raises the client's exception."""
        ...

    def delete(self, zone: str, name: str) -> None:
        """Delete the node and wait for the operation; a node that does not exist is success."""
        ...

    def address(self, zone: str, name: str) -> str | None:
        """The node's internal IP (a TPU slice's worker 0), or None while it has none (or it is gone): a member's
        address in a job of several nodes (functions/job.py; docs/architecture.md, "Multi-node jobs")."""
        ...

    def set_attributes(self, zone: str, name: str, values: dict[str, str]) -> None:
        """Set these metadata attributes, keep the others, wait for the operation (a member's generation)."""
        ...
