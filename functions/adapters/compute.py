"""Compute Engine GPU VMs through google-cloud-compute (REST), built by respawn.control.clients.

Every call is idempotent in effect: create meets 409 and adopts; delete of a missing node is success; start of a
running node is a no-op. Errors are the library's own exceptions (google.api_core.exceptions.*, with `.errors`
from the operation), so placement.classify reads the real shapes.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time

from google.api_core import exceptions as gexc
from google.api_core import extended_operation
from google.cloud import compute_v1

from respawn.contract import LABEL_JOB, Handover
from respawn.images import IMAGE_PATH, REQUEST_PREFIX, ImageCheck, ImageVerdict, found, image_path
from respawn.schema import JobSpec

from .. import models, nodespec
from ..settings import ControlSettings, NodeOptions

OP_TIMEOUT = ControlSettings.compute_op_timeout_seconds  # the default; Deps.default() passes RESPAWN_OP_TIMEOUT_SECONDS
DEFAULT_NETWORK = "global/networks/default"
DEFAULT_SERVICE_ACCOUNT = "default"  # the project's Compute Engine default service account
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
SET_METADATA_TRIES = 5  # reads and conditional writes before a 412 (a writer racing us every time) is raised
CHECK_TIMEOUT = 30.0  # seconds for a read that must never hold a delivery for long (the boot image, the console)
FLEX_START_POLL_SECONDS = 1.0  # between looks at a flex-start insert and its instance (is it PENDING yet?)


class ComputeOperation(extended_operation.ExtendedOperation):
    """compute_v1's own error mapping: the HTTP status and message of a finished operation with an error (the sim
    tests wrap operations with it too, so they see what the adapter sees)."""

    @property
    def error_message(self):
        return self._extended_operation.http_error_message

    @property
    def error_code(self):
        return self._extended_operation.http_error_status_code


class ComputeProvider:
    kind = "gpu"

    def __init__(self, clients, *, op_timeout: float = OP_TIMEOUT, nodes: NodeOptions = NodeOptions()):
        self.clients = clients
        self.project = clients.project
        self.op_timeout = op_timeout
        self.nodes = nodes

    def _wait(self, zone: str, op) -> None:
        # zoneOperations.wait returns as soon as the operation is DONE (or near its 2-minute deadline, and the
        # poller calls it again); polling with get would sleep 1 s and more between looks.
        ops = self.clients.zone_operations()
        request = compute_v1.WaitZoneOperationRequest(project=self.project, zone=zone, operation=op.name)
        ComputeOperation.make(functools.partial(ops.wait, request), lambda: None, op).result(timeout=self.op_timeout)

    def get(self, zone: str, name: str) -> str | None:
        """The instance status (PROVISIONING … TERMINATED), or None when it does not exist."""
        try:
            return self.clients.instances().get(project=self.project, zone=zone, instance=name).status
        except gexc.NotFound:
            return None

    def console_tail(self, zone: str, name: str, chars: int) -> str:
        """The end of serial port 1 (the startup script's and the agent's log lines): instances.getSerialPortOutput
        with a negative start, which asks for the most recent bytes (gcp-facts §14)."""
        # port and start are fields of the request only (the flattened call takes project, zone and instance).
        request = compute_v1.GetSerialPortOutputInstanceRequest(project=self.project, zone=zone, instance=name, port=1,
                                                                start=-chars)
        out = self.clients.instances().get_serial_port_output(request=request, retry=None, timeout=CHECK_TIMEOUT)
        return out.contents[-chars:]

    def address(self, zone: str, name: str) -> str | None:
        """The instance's internal IP (its first network interface), or None while it has none or is gone."""
        try:
            nics = self.clients.instances().get(project=self.project, zone=zone, instance=name).network_interfaces
        except gexc.NotFound:
            return None
        return (nics[0].network_i_p or None) if nics else None

    def list_labelled(self, zone: str) -> list[tuple[str, dict[str, str]]]:
        """(name, labels) of every instance in `zone` that carries the respawn-job label."""
        return [(i.name, dict(i.labels)) for i in self.clients.instances().list(project=self.project, zone=zone)
                if LABEL_JOB in i.labels]

    def image_path(self, spec: JobSpec) -> str:
        """The boot image as the create names it: a bare NAME is an image of this project."""
        return image_path(spec.accelerator.boot_image, self.project)

    def check_image(self, spec: JobSpec) -> ImageCheck:
        """Ask Compute Engine whether the boot image exists: images.getFromFamily for a family (the newest image
        that is not deprecated), images.get for a name. 404 → MISSING, and so is an OBSOLETE or DELETED image (new
        VMs are refused from it); anything else that stops the check (403 on the image's project, 5xx, network) →
        UNCHECKED: it must not block a job that may well boot."""
        path = self.image_path(spec)
        m = IMAGE_PATH.match(path)
        if m is None:  # the spec validator admits no other form
            return ImageCheck(path, ImageVerdict.UNCHECKED, "not an image path this check understands")
        images = self.clients.images()
        try:
            if m["family"]:
                image = images.get_from_family(project=m["project"], family=m["family"], retry=None,
                                               timeout=CHECK_TIMEOUT)
            else:
                image = images.get(project=m["project"], image=m["name"], retry=None, timeout=CHECK_TIMEOUT)
        except gexc.NotFound as exc:
            return ImageCheck(path, ImageVerdict.MISSING, REQUEST_PREFIX.sub("", exc.message or str(exc)))
        except Exception as exc:  # noqa: BLE001 - a check that cannot be made blocks nothing; reconcile logs it
            return ImageCheck(path, ImageVerdict.UNCHECKED, f"{type(exc).__name__}: {exc}"[:500])
        return found(path, image.name, image.deprecated.state if "deprecated" in image else "")

    def instance(self, spec: JobSpec, zone: str, name: str, attempt: int, provisioning: str, startup_script: str,
                 slot: int = 0, service_account: str | None = None, handover: Handover | None = None):
        acc = spec.accelerator
        # What differs between provisioning models is the model's (functions/models/): scheduling and the rest.
        fields = models.of(provisioning).compute(spec, models.tier_of(spec, provisioning))
        image = self.image_path(spec)
        accelerators = []
        if acc.accelerator_type:
            accelerators.append(compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{acc.accelerator_type}",
                accelerator_count=acc.accelerator_count))
        opts = self.nodes
        nic = compute_v1.NetworkInterface(network=opts.network or DEFAULT_NETWORK)
        if opts.subnetwork:
            nic.subnetwork = opts.subnetwork
        if opts.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        items = [compute_v1.Items(key=k, value=v)
                 for k, v in nodespec.metadata(spec, attempt, self.project, startup_script, opts,
                                               service_account, handover, fields.run_seconds,
                                               fields.run_ends_at).items()]
        return compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{acc.machine_type}",
            guest_accelerators=accelerators,
            scheduling=compute_v1.Scheduling(**fields.scheduling),
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True, type_="PERSISTENT",
                initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=image, disk_size_gb=acc.boot_disk_gb))],
            network_interfaces=[nic],
            metadata=compute_v1.Metadata(items=items),
            labels=nodespec.labels(spec, attempt, slot),
            service_accounts=[compute_v1.ServiceAccount(
                email=service_account or DEFAULT_SERVICE_ACCOUNT, scopes=SCOPES)],
            # Every node names its reservation affinity: the API's default, ANY_RESERVATION, would let an on-demand
            # node consume an open reservation of the project while the ledger prices it on demand (audit 4).
            **{"reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"}, **fields.extra},
        )

    def create(self, spec: JobSpec, zone: str, name: str, attempt: int, provisioning: str, startup_script: str,
               slot: int = 0, service_account: str | None = None, handover: Handover | None = None) -> bool:
        """Create and wait until the operation is done, or for a flex-start VM until it waits for capacity
        (PENDING): that wait is observed on the next passes, as a queued resource's is. False: it already existed
        (409) and is adopted."""
        body = self.instance(spec, zone, name, attempt, provisioning, startup_script, slot, service_account, handover)
        try:
            op = self.clients.instances().insert_unary(project=self.project, zone=zone, instance_resource=body)
            if models.of(provisioning).insert_waits_for_capacity:
                self._wait_unless_pending(zone, name, op)
            else:
                self._wait(zone, op)
        except gexc.Conflict:
            return False
        return True

    def _wait_unless_pending(self, zone: str, name: str, op) -> None:
        """Wait for a flex-start insert until it is done (its error raised as any insert's) or its instance is
        PENDING. Whether Compute keeps the insert open for the whole wait for capacity (up to 2 h) is unverified
        (gcp-facts §18); blocking on it would hold the delivery for op_timeout and then raise. Polled with
        zoneOperations.get, not wait: one wait call itself blocks for up to 2 minutes."""
        ops = self.clients.zone_operations()
        deadline = time.monotonic() + self.op_timeout
        while True:
            current = ops.get(project=self.project, zone=zone, operation=op.name)
            if current.status == compute_v1.Operation.Status.DONE:
                self._wait(zone, current)  # done: raises the operation's error, if any
                return
            if self.get(zone, name) == "PENDING":
                return
            if time.monotonic() >= deadline:
                raise concurrent.futures.TimeoutError(f"the insert of {name} in {zone} was neither done nor PENDING "
                                                      f"within {self.op_timeout:g} s")
            time.sleep(FLEX_START_POLL_SECONDS)

    def start(self, zone: str, name: str) -> None:
        op = self.clients.instances().start_unary(project=self.project, zone=zone, instance=name)
        self._wait(zone, op)

    def delete(self, zone: str, name: str) -> None:
        try:
            op = self.clients.instances().delete_unary(project=self.project, zone=zone, instance=name)
            self._wait(zone, op)
        except gexc.NotFound:
            return

    def set_attributes(self, zone: str, name: str, values: dict[str, str]) -> None:
        """Set metadata attributes of a node (the others kept) and wait for the operation: read the items and their
        fingerprint, write them back changed. setMetadata replaces the whole list and fails with 412 when the
        fingerprint is stale (someone wrote in between): read again and retry."""
        instances = self.clients.instances()
        for attempt in range(SET_METADATA_TRIES):
            current = instances.get(project=self.project, zone=zone, instance=name).metadata
            items = {i.key: i.value for i in current.items}
            if all(items.get(k) == v for k, v in values.items()):
                return  # already so: a repeated delivery writes nothing
            items.update(values)
            body = compute_v1.Metadata(fingerprint=current.fingerprint,
                                       items=[compute_v1.Items(key=k, value=v) for k, v in items.items()])
            try:
                op = instances.set_metadata_unary(project=self.project, zone=zone, instance=name,
                                                  metadata_resource=body)
                self._wait(zone, op)
                return
            except gexc.PreconditionFailed:
                if attempt == SET_METADATA_TRIES - 1:
                    raise
