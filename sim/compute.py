"""The Compute Engine v1 subset: zonal instances and zone operations, with the lifecycle our code depends on.

Instance status: PROVISIONING -> STAGING -> RUNNING (insert/start), RUNNING -> STOPPING -> TERMINATED (stop, or
preemption with termination action STOP), deleted (delete, or preemption with termination action DELETE).
Operations progress on the scheduler; an insert/start operation is DONE when the instance is RUNNING.
Capacity and quota refusals are decided when the request arrives and reported inside the operation, as the real
API does: ZONE_RESOURCE_POOL_EXHAUSTED with httpErrorStatusCode 503, QUOTA_EXCEEDED with 403.

Flex-start VMs (provisioningModel FLEX_START, docs/gcp-facts.md §18): capacity is their own model in the capacity
timeline, quota is the preemptible one. With no capacity and params.requestValidForDuration >= 90 s the instance
waits in status PENDING (not live, not billed) until capacity frees up in its zone (then PROVISIONING -> STAGING ->
RUNNING) or the wait runs out (then Compute deletes it: 404). While RUNNING, resourceStatus.scheduling.
terminationTimestamp is the run's end (start + maxRunDuration, set at every start); then the VM is stopped or
deleted as instanceTerminationAction says, as Compute's own stop or delete, never as a preemption. Both durations
pass sim.run_duration_scale times faster in wall time, and terminationTimestamp is the compressed end.

Reservations (docs/gcp-facts.md §26): an insert whose reservationAffinity is SPECIFIC_RESERVATION consumes the
zone's specific reservation, whose size is the capacity timeline's "RESERVATION" steps for the zone and
accelerator (sim.set_capacity(..., provisioning_model="RESERVATION")): the sim holds one per zone and accelerator,
under the name (or the shared path, projects/OWNER/reservations/NAME) the insert gives. Such a VM is standard
provisioning (never preempted; host maintenance still stops it) and is charged to no quota (the reservation holds
it). A zone without such steps has no reservation: the insert is refused at once; a reservation whose VMs are all in
use (in-use: live instances consuming it) refuses in the operation, as Compute Engine does. A calendar-mode
reservation (set_reservation_end: it ends at a wall-clock time) is consumed by RESERVATION_BOUND VMs only (a STANDARD
one is refused, and RESERVATION_BOUND names a specific reservation); at its end each of its VMs gets its termination
action, as Compute's own stop or delete (never a preemption), and from then on the reservation no longer exists.

Images (global, any project): get and getFromFamily over a small table of Deep Learning VM families (IMAGE_FAMILIES,
docs/gcp-facts.md §12) plus what add_image() registers; anything else is 404 `notFound`, and so is an insert whose
boot disk names it, on the call itself, as Compute Engine answers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from respawn import advice, audit
from respawn.agent.run_end import ENV_BOOT_TIME
from sim import audit_entries
from sim.capacity import region_of
from sim.core import NodeRecord, SimError, compute_error, rfc3339
from sim.nodes import NodeRuntime

if TYPE_CHECKING:
    from sim.server import SimServer

BASE = "https://www.googleapis.com/compute/v1"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LIVE = ("PROVISIONING", "STAGING", "RUNNING", "PENDING_STOP", "STOPPING")
MAX_NOTICE_SECONDS = 120  # scheduling.preemptionNoticeDuration: gcloud's documented range is [0s, 120s] (gcp-facts §17)
RUN_SECONDS = (600, 604_800)  # a FLEX_START VM's scheduling.maxRunDuration: 10 min to 7 days (gcp-facts §18)
WAIT_SECONDS = (90, 7200)  # params.requestValidForDuration: how long a flex-start request waits; 0 = no wait (§18)
# The machine series a FLEX_START VM may be: accelerator-optimized but A4X and G4, and H4D (gcp-facts §18).
FLEX_START_SERIES = ("a2", "a3", "a4", "g2", "h4d")
PREEMPTIBLE_QUOTA = ("SPOT", "FLEX_START")  # the models charged to the PREEMPTIBLE_* quota metrics (gcp-facts §18, §21)
RESERVATION = "RESERVATION"  # the sim's model of a VM consuming a specific reservation (its capacity timeline's key)
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
DEFAULT_GRACEFUL_SHUTDOWN_SECONDS = 600  # scheduling.gracefulShutdown enabled without maxDuration
SERIAL_BUFFER = 1 << 20  # bytes of serial port output Compute Engine keeps (getSerialPortOutput: "the last 1 MB")

DLVM_PROJECT = "deeplearning-platform-release"
# The Deep Learning VM families of docs/gcp-facts.md §12, each with its deprecation state as of 2026-11-23: current
# ones resolve; those past their end of patch (2026-04-13) are DEPRECATED, so their family no longer resolves while
# their image can still be named; those past their end of availability (the cu124 and older Debian 11 families) are
# absent. Image names are FAMILY-vDATE; the sim gives every family one image, of SIM_IMAGE_VERSION (the version
# date of the image Google's "Choose an image" page names as its example).
IMAGE_FAMILIES = {
    "common-cu129-ubuntu-2404-nvidia-580": "ACTIVE",
    "common-cu129-ubuntu-2204-nvidia-580": "ACTIVE",
    "pytorch-2-9-cu129-ubuntu-2404-nvidia-580": "ACTIVE",
    "pytorch-2-9-cu129-ubuntu-2204-nvidia-580": "ACTIVE",
    "common-cu128-ubuntu-2204-nvidia-570": "DEPRECATED",
    "pytorch-2-7-cu128-ubuntu-2204-nvidia-570": "DEPRECATED",
}
SIM_IMAGE_VERSION = "v20260416"
DEPRECATION_STATES = ("ACTIVE", "DEPRECATED", "OBSOLETE", "DELETED")
_SOURCE_IMAGE = re.compile(r"^(?:projects/(?P<project>[^/]+)/)?global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$")


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def quota_metric(accelerator: str, model: str) -> str:
    """The regions.get metric an instance of `accelerator` (a capacity key) and sim `model` is charged to
    (respawn.advice: gcp-facts §21); CPUS for a machine type without GPUs."""
    return advice.quota_metric(advice.gpu_of(accelerator), model.lower().replace("_", "-")) or (
        ("PREEMPTIBLE_" if model in PREEMPTIBLE_QUOTA else "") + "CPUS")


def quota_model(model: str) -> str:
    """The model whose quota timeline an instance of `model` is charged to: flex-start uses the preemptible quota,
    which the sim keys as "SPOT"."""
    return "SPOT" if model in PREEMPTIBLE_QUOTA else model


@dataclass
class Instance:
    zone: str
    name: str
    body: dict
    status: str
    record: NodeRecord
    runtime: NodeRuntime
    accelerator: str
    model: str
    gen: int = 0  # bumped by every state change, so stale scheduled steps do nothing
    shutdown: threading.Thread | None = None
    deleting: bool = False  # a delete was asked: a PENDING instance is no longer given capacity
    pending_op: "Operation | None" = None  # the insert a PENDING instance's request keeps open (flex_start_insert="wait")
    ends_at: float | None = None  # a RESERVATION_BOUND VM's reservation's end (wall clock): its termination action

    @property
    def id(self) -> str:
        return self.body["id"]

    @property
    def termination_action(self) -> str:
        return self.body.get("scheduling", {}).get("instanceTerminationAction") or "STOP"

    @property
    def shape(self) -> tuple[str, int]:
        """(machine type, accelerator count): what a capacity error names."""
        return (_last(self.body["machineType"]),
                sum(a["acceleratorCount"] for a in self.body.get("guestAccelerators", [])))

    @property
    def run_seconds(self) -> float:
        """scheduling.maxRunDuration: how long one run lasts before the termination action; 0 = unlimited."""
        return _duration_seconds(self.body.get("scheduling", {}).get("maxRunDuration"))

    @property
    def notice_seconds(self) -> float:
        """scheduling.preemptionNoticeDuration: how long instance/preempted is TRUE before the soft-off."""
        return _duration_seconds(self.body.get("scheduling", {}).get("preemptionNoticeDuration"))

    @property
    def graceful_shutdown_seconds(self) -> float:
        """scheduling.gracefulShutdown: the guest's time to shut down on a user's stop or delete (never on a
        preemption); 0 when off."""
        graceful = self.body.get("scheduling", {}).get("gracefulShutdown") or {}
        if not graceful.get("enabled"):
            return 0.0
        return _duration_seconds(graceful.get("maxDuration")) or DEFAULT_GRACEFUL_SHUTDOWN_SECONDS


def _duration_seconds(value: Any) -> float:
    """A compute Duration ({"seconds": "120", "nanos": 0}, int64 seconds as a JSON string) in seconds."""
    if not value:
        return 0.0
    return float(value.get("seconds") or 0) + float(value.get("nanos") or 0) / 1e9


def _check_notice_duration(scheduling: dict, model: str) -> None:
    seconds = _duration_seconds(scheduling.get("preemptionNoticeDuration"))
    if seconds and model != "SPOT":
        raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.preemptionNoticeDuration': "
                                            "a preemption notice duration is allowed only with the SPOT provisioning model")
    if not 0 <= seconds <= MAX_NOTICE_SECONDS:
        raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.preemptionNoticeDuration': "
                                            f"{seconds:g}s. Valid values are [0s, {MAX_NOTICE_SECONDS}s]")


def _check_run_duration(body: dict, scheduling: dict, model: str) -> None:
    """What Compute refuses of a flex-start request (gcp-facts §18) and of a limited run time (§17), with 400."""
    run = _duration_seconds(scheduling.get("maxRunDuration"))
    if model == "FLEX_START":
        machine_type = _last(body["machineType"])
        if machine_type.split("-")[0] not in FLEX_START_SERIES:  # the message's wording is the sim's (unverified)
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                                f"'FLEX_START'. Machine type {machine_type} does not support the "
                                                "FLEX_START provisioning model")
        if not run:
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.maxRunDuration': a "
                                                "FLEX_START instance needs a maximum run duration")
        if not RUN_SECONDS[0] <= run <= RUN_SECONDS[1]:
            raise compute_error(400, "invalid", f"Invalid value for field 'resource.scheduling.maxRunDuration': "
                                                f"{run:g}s. Valid values for the FLEX_START provisioning model are "
                                                f"[{RUN_SECONDS[0]}s, {RUN_SECONDS[1]}s]")
        if scheduling.get("instanceTerminationAction") not in ("STOP", "DELETE"):
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.instanceTerminationAction': "
                                                f"'{scheduling.get('instanceTerminationAction', '')}'. A FLEX_START "
                                                "instance needs STOP or DELETE, done when its run ends")
    if run and (scheduling.get("gracefulShutdown") or {}).get("enabled"):
        raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.gracefulShutdown': graceful "
                                            "shutdown is not supported for an instance with a limited run time")
    wait = _duration_seconds((body.get("params") or {}).get("requestValidForDuration"))
    if wait and not WAIT_SECONDS[0] <= wait <= WAIT_SECONDS[1]:
        raise compute_error(400, "invalid", f"Invalid value for field 'resource.params.requestValidForDuration': "
                                            f"{wait:g}s. Valid values are 0s or [{WAIT_SECONDS[0]}s, {WAIT_SECONDS[1]}s]")


@dataclass
class Image:
    project: str
    name: str
    family: str | None
    state: str  # DeprecationStatus.State: ACTIVE, DEPRECATED, OBSOLETE, DELETED
    id: str

    @property
    def path(self) -> str:
        return f"projects/{self.project}/global/images/{self.name}"

    def resource(self) -> dict:
        body = {"kind": "compute#image", "id": self.id, "creationTimestamp": "2026-04-16T00:00:00.000-07:00",
                "name": self.name, "status": "READY", "sourceType": "RAW", "selfLink": f"{BASE}/{self.path}"}
        if self.family:
            body["family"] = self.family
        if self.state != "ACTIVE":
            body["deprecated"] = {"state": self.state}
        return body


@dataclass
class Operation:
    zone: str
    body: dict
    done: threading.Event = field(default_factory=threading.Event)


class ComputeService:
    def __init__(self, sim: "SimServer") -> None:
        self.sim = sim
        self.instances: dict[tuple[str, str], Instance] = {}
        self.operations: dict[tuple[str, str], Operation] = {}
        self._ids = random.Random(1)
        self.images: dict[tuple[str, str], Image] = {}  # (project, name) → Image
        self.firewalls: dict[tuple[str, str], dict] = {}  # (project, name) → the firewall resource
        self.queue: list[Instance] = []  # PENDING flex-start instances, first asked first served
        self.reservation_ends: dict[tuple[str, str], float] = {}  # (zone, accelerator) → a calendar reservation's end
        self._serving = False  # a pass over the queue is scheduled
        for family, state in IMAGE_FAMILIES.items():
            self.add_image(DLVM_PROJECT, f"{family}-{SIM_IMAGE_VERSION}", family=family, deprecated=state)

    # --- images ---------------------------------------------------------------------------------------------

    def add_image(self, project: str, name: str, *, family: str | None = None, deprecated: str = "ACTIVE") -> None:
        """Make an image exist (in any project: a job's own custom image, another Deep Learning VM family)."""
        if deprecated not in DEPRECATION_STATES:
            raise SimError(f"deprecation state {deprecated!r}: use one of {', '.join(DEPRECATION_STATES)}")
        for value in (project, name, family or "a"):
            if not NAME_RE.match(value):
                raise SimError(f"{value!r} is not a Compute Engine resource name")
        with self.sim.cond:
            self.images[(project, name)] = Image(project, name, family, deprecated, self._new_id())

    # --- firewall rules (what `respawn jobs register` looks for before a multi-node job) ----------------------------

    def add_firewall(self, project: str, name: str, *, service_account: str, network: str = "default",
                     disabled: bool = False) -> None:
        """An ingress rule allowing every protocol from `service_account` to itself, as the build creates it."""
        if not NAME_RE.match(name):
            raise SimError(f"{name!r} is not a Compute Engine resource name")
        with self.sim.cond:
            self.firewalls[(project, name)] = {
                "kind": "compute#firewall", "id": self._new_id(), "name": name, "direction": "INGRESS",
                "network": f"{BASE}/projects/{project}/global/networks/{network}", "priority": 1000,
                "allowed": [{"IPProtocol": "all"}], "sourceServiceAccounts": [service_account],
                "targetServiceAccounts": [service_account], "disabled": disabled,
                "selfLink": f"{BASE}/projects/{project}/global/firewalls/{name}"}

    def get_firewall(self, project: str, name: str) -> dict:
        with self.sim.cond:
            rule = self.firewalls.get((project, name))
            if rule is None:
                raise compute_error(404, "notFound",
                                    f"The resource 'projects/{project}/global/firewalls/{name}' was not found")
            return dict(rule)

    def get_image(self, project: str, name: str) -> dict:
        with self.sim.cond:
            image = self.images.get((project, name))
            if image is None:
                raise compute_error(404, "notFound", f"The resource 'projects/{project}/global/images/{name}' was not found")
            return image.resource()

    def get_image_from_family(self, project: str, family: str) -> dict:
        """The newest image of the family that is not deprecated (images.getFromFamily)."""
        with self.sim.cond:
            members = [i for (p, _), i in self.images.items() if p == project and i.family == family and i.state == "ACTIVE"]
            if not members:
                raise compute_error(404, "notFound",
                                    f"The resource 'projects/{project}/global/images/family/{family}' was not found")
            return max(members, key=lambda i: i.name).resource()

    def _check_source_image(self, body: dict) -> None:
        """An insert whose boot disk names an image that does not resolve answers 404 on the call, as Compute does."""
        for disk in body.get("disks") or []:
            source = (disk.get("initializeParams") or {}).get("sourceImage")
            if not source:
                continue
            path = source.split("/compute/v1/", 1)[-1]
            m = _SOURCE_IMAGE.match(path)
            if m is None:
                raise compute_error(400, "invalid", f"Invalid value for field 'resource.disks[0].initializeParams.sourceImage': "
                                    f"'{source}'. The URL is malformed.")
            project = m["project"] or self.sim.project
            if m["family"]:
                self.get_image_from_family(project, m["family"])
                continue
            image = self.get_image(project, m["name"])
            state = image.get("deprecated", {}).get("state")
            if state in ("OBSOLETE", "DELETED"):
                raise SimError(f"image {path} is {state}: the sim does not play an insert from such an image "
                               "(Compute Engine refuses it; its exact error is not recorded in docs/gcp-facts.md)")

    # --- helpers --------------------------------------------------------------------------------------------

    def _path(self, zone: str, name: str) -> str:
        return f"projects/{self.sim.project}/zones/{zone}/instances/{name}"

    def _get(self, zone: str, name: str) -> Instance:
        inst = self.instances.get((zone, name))
        if inst is None:
            raise compute_error(404, "notFound", f"The resource '{self._path(zone, name)}' was not found")
        return inst

    def _new_id(self) -> str:
        return str(self._ids.randrange(10**18, 10**19))

    def _new_op(self, zone: str, op_type: str, target: str, target_id: str, *, system: bool = False) -> Operation:
        now = time.time()
        name = (f"systemevent-{int(now * 1000)}-" if system else "operation-") + f"{int(now * 1000)}-{self._new_id()[:8]}"
        op = Operation(zone, {
            "kind": "compute#operation", "id": self._new_id(), "name": name,
            "zone": f"{BASE}/projects/{self.sim.project}/zones/{zone}",
            "operationType": op_type, "targetLink": f"{BASE}/{target}", "targetId": target_id,
            "status": "RUNNING", "user": "system" if system else "respawn@sim", "progress": 0,
            "insertTime": rfc3339(now), "startTime": rfc3339(now),
            "selfLink": f"{BASE}/projects/{self.sim.project}/zones/{zone}/operations/{name}",
        })
        self.operations[(zone, name)] = op
        return op

    def _finish(self, op: Operation | None, error: dict | None = None, http: tuple[int, str] | None = None) -> None:
        """End the operation (None: a step Compute takes on its own, with no operation of the caller's to end)."""
        if op is None:
            return
        with self.sim.cond:
            op.body.update(status="DONE", progress=100, endTime=rfc3339())
            if error:
                op.body["error"] = {"errors": [error]}
                op.body["httpErrorStatusCode"], op.body["httpErrorMessage"] = http
            op.done.set()
            self.sim.cond.notify_all()

    def _set_status(self, inst: Instance, status: str) -> None:
        inst.status = status
        inst.gen += 1
        inst.body["status"] = status
        if status != "RUNNING":  # the run's end (the sim's only resourceStatus) is known only while it runs (§18)
            inst.body.pop("resourceStatus", None)
        inst.record.transition(self.sim.now(), status, status in LIVE)

    def _refusal(self, zone: str, accelerator: str, model: str, machine_type: str, count: int,
                 reservation: str = "") -> tuple[dict, tuple] | None:
        """A quota or capacity error for adding one node now, or None."""
        t = self.sim.now()
        if model == RESERVATION:
            return self._reservation_full(zone, accelerator, reservation, t)
        region = region_of(zone)
        pool = quota_model(model)
        limit, specific = self.sim.quota.limit(region, accelerator, pool, t)
        if limit is not None:
            used = self.sim.usage("quota", region, accelerator, pool if specific else None)
            if used + 1 > limit:
                metric = quota_metric(accelerator, model)
                message = f"Quota '{metric}' exceeded.  Limit: {float(limit)} in region {region}."
                return ({"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [
                    {"quotaInfo": {"metricName": f"compute.googleapis.com/{metric.lower()}", "limitName": f"{metric}-per-project-region",
                                   "dimensions": {"region": region}, "limit": float(limit)}},
                ]}, (403, "FORBIDDEN"))
        limit, specific = self.sim.capacity.limit(zone, accelerator, model, t)
        if limit is not None:
            used = self.sim.usage("capacity", zone, accelerator, model if specific else None)
            if used + 1 > limit:
                return self._stockout(zone, accelerator, machine_type, count)
        return None

    def _reservation(self, zone: str, body: dict, accelerator: str) -> str:
        """The reservation a SPECIFIC_RESERVATION insert names, or the 400 Compute Engine answers when the zone has
        none of that name (gcp-facts §26: its message as clients match it; the status is unverified)."""
        affinity = body.get("reservationAffinity") or {}
        values = affinity.get("values") or []
        if affinity.get("key") != RESERVATION_KEY or len(values) != 1:
            raise compute_error(400, "invalid", "Invalid value for field 'resource.reservationAffinity': a "
                                f"SPECIFIC_RESERVATION affinity names one reservation under key {RESERVATION_KEY}")
        name = values[0]
        _, specific = self.sim.capacity.limit(zone, accelerator, RESERVATION, self.sim.now())
        if not specific or self.reservation_ends.get((zone, accelerator), float("inf")) <= time.time():
            raise compute_error(400, "invalid", f"Could not find the given reservation with the following name: "
                                                f"{name} in zone {zone}")
        return name

    def _bound(self, zone: str, accelerator: str, requested: str | None, scheduling: dict) -> float | None:
        """A calendar-mode reservation's end (wall clock), for the RESERVATION_BOUND VM that consumes it; None for
        an ordinary reservation. The 400s for the wrong pairing are the sim's words (gcp-facts §26: Compute Engine
        refuses other provisioning models on these reservations; its message is unverified)."""
        ends_at = self.reservation_ends.get((zone, accelerator))
        if ends_at is not None and requested != "RESERVATION_BOUND":
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                f"'{requested or 'STANDARD'}'. A calendar-mode reservation is consumed by "
                                "RESERVATION_BOUND instances only")
        if ends_at is None and requested == "RESERVATION_BOUND":
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                "'RESERVATION_BOUND'. The reservation is not in calendar mode")
        if ends_at is not None and scheduling.get("instanceTerminationAction") not in ("STOP", "DELETE"):
            raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.instanceTerminationAction'"
                                ": a RESERVATION_BOUND instance needs STOP or DELETE, done at the reservation's end")
        return ends_at

    def _reservation_full(self, zone: str, accelerator: str, name: str, t: float) -> tuple[dict, tuple] | None:
        """The error of a reservation whose VMs are all in use, or None (gcp-facts §26: the message as clients match
        it; the code and HTTP status are unverified)."""
        limit, _ = self.sim.capacity.limit(zone, accelerator, RESERVATION, t)
        if limit is None or self.sim.usage("capacity", zone, accelerator, RESERVATION) + 1 <= limit:
            return None
        short = name.rsplit("/", 1)[-1]
        return ({"code": "RESERVATION_CAPACITY_EXCEEDED",
                 "message": f"Reservation {short} does not have sufficient capacity for the requested resources."},
                (503, "SERVICE UNAVAILABLE"))

    def _stockout(self, zone: str, accelerator: str, machine_type: str, count: int) -> tuple[dict, tuple]:
        what = (f"A {machine_type} VM instance with {count} {accelerator} accelerator(s)" if count
                else f"A {machine_type} VM instance")
        message = (f"The zone 'projects/{self.sim.project}/zones/{zone}' does not have enough resources "
                   "available to fulfill the request.  Try a different zone, or try again later.")
        return ({"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message, "errorDetails": [
            {"errorInfo": {"reason": "resource_availability", "domain": "compute.googleapis.com",
                           "metadatas": {"zone": zone, "vmType": machine_type, "attachment": f"{accelerator}:{count}"}}},
            {"localizedMessage": {"locale": "en-US", "message": f"{what} is currently unavailable in the {zone} zone."}},
        ]}, (503, "SERVICE UNAVAILABLE"))

    # --- API ------------------------------------------------------------------------------------------------

    def insert(self, zone: str, body: dict) -> dict:
        name = body.get("name", "")
        if not NAME_RE.match(name):
            raise compute_error(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. "
                                "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        if not body.get("machineType"):
            raise compute_error(400, "invalid", "Invalid value for field 'resource.machineType': ''. A machine type is required.")
        with self.sim.cond:
            if (zone, name) in self.instances:
                raise compute_error(409, "alreadyExists", f"The resource '{self._path(zone, name)}' already exists")
            self._check_source_image(body)
            machine_type = _last(body["machineType"])
            accels = body.get("guestAccelerators") or []
            accelerator = _last(accels[0]["acceleratorType"]) if accels else machine_type
            count = int(accels[0].get("acceleratorCount", 1)) if accels else 0
            scheduling = dict(body.get("scheduling") or {})
            requested = scheduling.get("provisioningModel")
            model = ("FLEX_START" if requested == "FLEX_START" else
                     "SPOT" if requested == "SPOT" or scheduling.get("preemptible") else "STANDARD")
            reservation, ends_at = "", None
            consume = (body.get("reservationAffinity") or {}).get("consumeReservationType")
            if consume == "SPECIFIC_RESERVATION":
                if model != "STANDARD":
                    raise compute_error(400, "invalid", "Invalid value for field 'resource.reservationAffinity': "
                                                        f"a {model} VM cannot consume a reservation")
                reservation, model = self._reservation(zone, body, accelerator), RESERVATION
                ends_at = self._bound(zone, accelerator, requested, scheduling)
            elif requested == "RESERVATION_BOUND":
                raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.provisioningModel': "
                                                    "'RESERVATION_BOUND'. It needs a SPECIFIC_RESERVATION affinity")
            _check_notice_duration(scheduling, model)
            _check_run_duration(body, scheduling, model)
            iid = self._new_id()
            op = self._new_op(zone, "insert", self._path(zone, name), iid)
            refusal = self._refusal(zone, accelerator, model, machine_type, count, reservation)
            # A flex-start request that may wait waits for capacity; a quota refusal is final (gcp-facts §18).
            wait = _duration_seconds((body.get("params") or {}).get("requestValidForDuration"))
            queued = (model == "FLEX_START" and wait > 0 and refusal is not None
                      and refusal[0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED")
            if refusal and not queued:
                self.sim.op_step(zone, self.sim.op_delay, self._finish, op, *refusal)
                return dict(op.body)
            if model == "SPOT":
                scheduling.setdefault("provisioningModel", "SPOT")
                scheduling.setdefault("instanceTerminationAction", "STOP")
                scheduling.setdefault("automaticRestart", False)
            scheduling.setdefault("onHostMaintenance", "TERMINATE" if accels or model == "SPOT" else "MIGRATE")
            resource = dict(body)
            resource.update({
                "kind": "compute#instance", "id": iid, "creationTimestamp": rfc3339(),
                "zone": f"{BASE}/projects/{self.sim.project}/zones/{zone}",
                "machineType": f"{BASE}/projects/{self.sim.project}/zones/{zone}/machineTypes/{machine_type}",
                "selfLink": f"{BASE}/{self._path(zone, name)}", "scheduling": scheduling,
                "guestAccelerators": [
                    {"acceleratorType": f"{BASE}/projects/{self.sim.project}/zones/{zone}/acceleratorTypes/{_last(a['acceleratorType'])}",
                     "acceleratorCount": int(a.get("acceleratorCount", 1))} for a in accels],
                "metadata": {"kind": "compute#metadata", "fingerprint": "c2ltLW1ldGFkYXRh",
                             "items": list((body.get("metadata") or {}).get("items") or [])},
                "labels": dict(body.get("labels") or {}), "labelFingerprint": "c2ltLWxhYmVscw==",
            })
            if not accels:
                resource.pop("guestAccelerators")
            nics = [dict(n) for n in body.get("networkInterfaces") or [{"network": "global/networks/default"}]]
            nics[0]["networkIP"], host = self.sim.new_hosts(name)[0]
            resource["networkInterfaces"] = nics
            record = NodeRecord("instance", zone, name, dict(resource["labels"]), accelerator, model, self.sim.now())
            runtime = self.sim.make_runtime("compute", zone, name, self._metadata_kwargs(zone, name, iid, machine_type, resource),
                                            host=host)
            inst = Instance(zone, name, resource, "", record, runtime, accelerator, model, ends_at=ends_at)
            self.instances[(zone, name)] = inst
            self.sim.records.append(record)
            if queued:
                self._enqueue(inst, op, wait)
            else:
                self._set_status(inst, "PROVISIONING")
                self.sim.op_step(zone, self.sim.op_delay, self._to_staging, inst, inst.gen, op)
        self.sim.emit(audit_entries.activity("v1.compute.instances.insert", project=self.sim.project,
                                             resource_name=self._path(zone, name)))
        return dict(op.body)

    def _metadata_kwargs(self, zone: str, name: str, iid: str, machine_type: str, resource: dict) -> dict:
        items = resource["metadata"]["items"]
        return {"name": name, "zone": zone, "project": self.sim.project, "instance_id": iid,
                "machine_type": machine_type, "attributes": {i["key"]: i.get("value", "") for i in items},
                "address": resource["networkInterfaces"][0]["networkIP"]}

    # --- flex-start: the wait for capacity and the run's end (gcp-facts §18) ------------------------------------

    def _enqueue(self, inst: Instance, op: Operation, wait: float) -> None:
        """PENDING until capacity frees up in the zone, or until the request's validity ends (under the lock)."""
        self._set_status(inst, "PENDING")
        self.queue.append(inst)
        # Unverified (gcp-facts §18): whether the insert operation ends when the request is queued or stays open
        # for the whole wait (gcloud is said to block until capacity comes or the request expires). "done" (the
        # default) ends it at once, so a caller must read the instance (PENDING) to know whether the VM runs;
        # "wait" keeps it open and ends it when the VM runs or, with ZONE_RESOURCE_POOL_EXHAUSTED, when the wait
        # runs out, so a caller that blocks on it meets its own timeout. A caller robust to both never takes a
        # DONE insert for a running VM and never takes an unfinished one for a failure.
        if self.sim.flex_start_insert == "wait":
            inst.pending_op = op
        else:
            self.sim.op_step(inst.zone, self.sim.op_delay, self._finish, op)
        self.sim.scheduler.call_later(wait * self.sim.run_duration_scale, self._expire, inst, inst.gen)
        if not self._serving:
            self._serving = True
            self.sim.scheduler.call_later(self._serve_interval(), self._serve_queue)

    def _serve_interval(self) -> float:
        return max(self.sim.op_delay, 0.05)

    def _serve_queue(self) -> None:
        """Give freed capacity (and quota) to the PENDING instances, first asked first; again while any waits."""
        with self.sim.cond:
            for inst in list(self.queue):
                if inst.deleting or self.instances.get((inst.zone, inst.name)) is not inst or inst.status != "PENDING":
                    self.queue.remove(inst)
                    continue
                if self._refusal(inst.zone, inst.accelerator, inst.model, *inst.shape) is not None:
                    continue
                self.queue.remove(inst)
                op, inst.pending_op = inst.pending_op, None
                self._set_status(inst, "PROVISIONING")
                self.sim.op_step(inst.zone, self.sim.op_delay, self._to_staging, inst, inst.gen, op)
            self._serving = bool(self.queue)
            if self._serving:
                self.sim.scheduler.call_later(self._serve_interval(), self._serve_queue)

    def _expire(self, inst: Instance, gen: int) -> None:
        """The request's validity ran out with no capacity: Compute deletes the instance (no audit entry known)."""
        with self.sim.cond:
            if inst.gen != gen or inst.deleting or self.instances.get((inst.zone, inst.name)) is not inst:
                return  # it got capacity, or was deleted
            del self.instances[(inst.zone, inst.name)]
            if inst in self.queue:
                self.queue.remove(inst)
            inst.gen += 1
            inst.record.deleted(self.sim.now())
            op, inst.pending_op = inst.pending_op, None
        inst.runtime.destroy()
        self._finish(op, *self._stockout(inst.zone, inst.accelerator, *inst.shape))

    def _boot_env(self, inst: Instance) -> dict[str, str]:
        """A limited run's VM tells its agent when it started (the host's kernel boot is not its own), shifted so
        that the agent's end (start + maxRunDuration) falls where the sim's compressed end does."""
        if not inst.run_seconds:
            return {}
        return {ENV_BOOT_TIME: repr(time.time() - inst.run_seconds * (1 - self.sim.run_duration_scale))}

    def _run_ended(self, inst: Instance, gen: int) -> None:
        """maxRunDuration is over (or the reservation of a reservation-bound VM ended): the termination action, as
        Compute's own stop or delete. Not a preemption:
        instance/preempted stays FALSE and no compute.instances.preempted entry is written; no gracefulShutdown
        (refused at insert for a limited run time, gcp-facts §17)."""
        with self.sim.cond:
            if inst.gen != gen or self.instances.get((inst.zone, inst.name)) is not inst or inst.status != "RUNNING":
                return  # stopped, restarted or deleted since: that run's end no longer applies
            self._set_status(inst, "STOPPING")
            if inst.termination_action == "DELETE":
                inst.deleting = True
                threading.Thread(target=self._delete, args=(inst, None, inst.shutdown), name=f"run-end-{inst.name}",
                                 daemon=True).start()
            else:
                self._shutdown(inst, self.sim.notice_seconds, then=lambda: self._stopped(inst, None))

    # --- lifecycle steps --------------------------------------------------------------------------------------

    def _to_staging(self, inst: Instance, gen: int, op: Operation | None) -> None:
        with self.sim.cond:
            if inst.gen != gen or self.instances.get((inst.zone, inst.name)) is not inst:
                self._finish(op)  # deleted or preempted while provisioning: the insert still ends
                return
            self._set_status(inst, "STAGING")
            self.sim.op_step(inst.zone, self.sim.op_delay, self._to_running, inst, inst.gen, op)

    def _to_running(self, inst: Instance, gen: int, op: Operation | None) -> None:
        with self.sim.cond:
            if inst.gen != gen or self.instances.get((inst.zone, inst.name)) is not inst:
                self._finish(op)
                return
            self._set_status(inst, "RUNNING")
            inst.body["lastStartTimestamp"] = rfc3339()
            if inst.run_seconds:  # every start begins a new run (gcp-facts §18)
                wall = inst.run_seconds * self.sim.run_duration_scale
                inst.body["resourceStatus"] = {"scheduling": {"terminationTimestamp": rfc3339(time.time() + wall)}}
                self.sim.scheduler.call_later(wall, self._run_ended, inst, inst.gen)
            if inst.ends_at is not None:  # a reservation-bound VM ends with its reservation, at every start
                self.sim.scheduler.call_later(inst.ends_at - time.time(), self._run_ended, inst, inst.gen)
            inst.record.boots += 1
            inst.runtime.boot(self._boot_env(inst))
        self._finish(op)

    def get(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            return dict(self._get(zone, name).body)

    def serial_port_output(self, zone: str, name: str, port: int = 1, start: int = 0) -> dict:
        """instances.getSerialPortOutput: port 1 is the node's console log (what its boots printed). Positions are
        byte offsets over everything written; only the last SERIAL_BUFFER bytes are kept, and a start before them
        is moved up to the oldest kept (the answer's `start` says where it began); a negative start asks for that
        many of the most recent bytes. Ports 2-4 are empty (nothing in the guest writes to them)."""
        if not 1 <= port <= 4:
            raise compute_error(400, "invalid", f"Invalid value for field 'port': '{port}'. Must be between 1 and 4.")
        with self.sim.cond:
            inst = self._get(zone, name)
            path = inst.runtime.console_log
        try:
            data = path.read_bytes() if port == 1 else b""
        except FileNotFoundError:
            data = b""
        size = len(data)
        oldest = max(0, size - SERIAL_BUFFER)
        begin = max(size + start, oldest) if start < 0 else max(start, oldest)
        begin = min(begin, size)
        return {"kind": "compute#serialPortOutput", "contents": data[begin:].decode("utf-8", "replace"),
                "start": str(begin), "next": str(size),
                "selfLink": f"{BASE}/{self._path(zone, name)}/serialPort"}

    def set_metadata(self, zone: str, name: str, body: dict) -> dict:
        """instances.setMetadata: the whole item list is replaced, conditional on the fingerprint the caller read
        (412 conditionNotMet when it changed since: optimistic locking, gcp-facts). A running node's metadata
        server serves the new attributes at once, waking its hanging GETs; a node not booted yet gets them at boot."""
        items = [{"key": i["key"], "value": i.get("value", "")} for i in body.get("items") or []]
        with self.sim.cond:
            inst = self._get(zone, name)
            current = inst.body["metadata"]
            if body.get("fingerprint") != current["fingerprint"]:
                raise compute_error(412, "conditionNotMet", "Supplied fingerprint does not match current metadata "
                                    "fingerprint.")
            before = {i["key"]: i.get("value", "") for i in current["items"]}
            after = {i["key"]: i["value"] for i in items}
            digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode() + inst.id.encode()).digest()
            inst.body["metadata"] = {"kind": "compute#metadata", "items": items,
                                     "fingerprint": base64.b64encode(digest[:8]).decode()}
            inst.runtime.set_attributes(before.keys() - after.keys(), after)
            op = self._new_op(zone, "setMetadata", self._path(zone, name), inst.id)
            self.sim.scheduler.call_later(self.sim.metadata_op_delay, self._finish, op)
        return dict(op.body)

    def list(self, zone: str, filter_text: str | None) -> dict:
        with self.sim.cond:
            items = [dict(i.body) for (z, _), i in sorted(self.instances.items()) if z == zone]
        if filter_text:
            items = [i for i in items if _match_filter(i, filter_text)]
        return {"kind": "compute#instanceList", "id": f"projects/{self.sim.project}/zones/{zone}/instances",
                "items": items, "selfLink": f"{BASE}/projects/{self.sim.project}/zones/{zone}/instances"}

    def start(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            inst = self._get(zone, name)
            op = self._new_op(zone, "start", self._path(zone, name), inst.id)
            if inst.status == "STOPPING":
                raise compute_error(400, "resourceNotReady", f"The resource '{self._path(zone, name)}' is not ready")
            if inst.status != "TERMINATED":
                self.sim.op_step(zone, self.sim.op_delay, self._finish, op)
                return dict(op.body)
            refusal = self._refusal(zone, inst.accelerator, inst.model, *inst.shape)
            if refusal:
                self.sim.op_step(zone, self.sim.op_delay, self._finish, op, *refusal)
                return dict(op.body)
            self._set_status(inst, "STAGING")
            self.sim.op_step(zone, self.sim.op_delay, self._to_running, inst, inst.gen, op)
        return dict(op.body)

    def stop(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            inst = self._get(zone, name)
            if inst.status == "PENDING":  # unverified what Compute does; the sim asks for a delete instead
                raise compute_error(400, "resourceNotReady", f"The resource '{self._path(zone, name)}' is not ready: "
                                    "it is waiting for capacity (PENDING); delete it to withdraw the request")
            op = self._new_op(zone, "stop", self._path(zone, name), inst.id)
            if inst.status in ("TERMINATED", "STOPPING", "PENDING_STOP"):
                self.sim.scheduler.call_later(self.sim.op_delay, self._finish, op)
                return dict(op.body)
            graceful = inst.graceful_shutdown_seconds
            self._set_status(inst, "PENDING_STOP" if graceful else "STOPPING")
            self._shutdown(inst, graceful or self.sim.notice_seconds, then=lambda: self._stopped(inst, op))
        return dict(op.body)

    def delete(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            inst = self._get(zone, name)
            op = self._new_op(zone, "delete", self._path(zone, name), inst.id)
            graceful = inst.graceful_shutdown_seconds if inst.status in LIVE else 0.0
            inst.deleting = True
            if inst.status in LIVE:
                self._set_status(inst, "PENDING_STOP" if graceful else "STOPPING")
            pending = inst.shutdown
            threading.Thread(target=self._delete, args=(inst, op, pending, graceful), name=f"delete-{name}",
                             daemon=True).start()
        self.sim.emit(audit_entries.activity("v1.compute.instances.delete", project=self.sim.project,
                                             resource_name=self._path(zone, name)))
        return dict(op.body)

    def _delete(self, inst: Instance, op: Operation | None, pending: threading.Thread | None, grace: float = 0.0) -> None:
        if pending is not None:
            pending.join()
        inst.runtime.power_off(grace or self.sim.delete_grace)
        inst.runtime.destroy()
        with self.sim.cond:
            if self.instances.get((inst.zone, inst.name)) is inst:
                del self.instances[(inst.zone, inst.name)]
                inst.gen += 1
                inst.record.deleted(self.sim.now())
            insert, inst.pending_op = inst.pending_op, None
        self._finish(insert)  # a withdrawn flex-start request's insert ends, as one deleted while provisioning
        self._finish(op)

    def _shutdown(self, inst: Instance, grace: float, then) -> None:
        """ACPI soft off in the background; `then` runs once the guest is gone (under no lock)."""
        def run():
            inst.runtime.power_off(grace)
            then()
        inst.shutdown = threading.Thread(target=run, name=f"shutdown-{inst.name}", daemon=True)
        inst.shutdown.start()

    def _stopped(self, inst: Instance, op: Operation | None) -> None:
        with self.sim.cond:
            if self.instances.get((inst.zone, inst.name)) is inst and inst.status in ("PENDING_STOP", "STOPPING"):
                self._set_status(inst, "TERMINATED")
                inst.body["lastStopTimestamp"] = rfc3339()
            inst.shutdown = None
        if op is not None:
            self._finish(op)

    def get_operation(self, zone: str, name: str) -> dict:
        with self.sim.cond:
            op = self.operations.get((zone, name))
            if op is None:
                raise compute_error(404, "notFound",
                                    f"The resource 'projects/{self.sim.project}/zones/{zone}/operations/{name}' was not found")
            return dict(op.body)

    def wait_operation(self, zone: str, name: str, timeout: float = 120) -> dict:
        self.get_operation(zone, name)
        op = self.operations[(zone, name)]
        op.done.wait(timeout)
        return self.get_operation(zone, name)

    def list_operations(self, zone: str, filter_text: str | None) -> dict:
        with self.sim.cond:
            items = [dict(o.body) for (z, _), o in self.operations.items() if z == zone]
        if filter_text:
            items = [i for i in items if _match_filter(i, filter_text)]
        return {"kind": "compute#operationList", "items": items,
                "selfLink": f"{BASE}/projects/{self.sim.project}/zones/{zone}/operations"}

    # --- system events ----------------------------------------------------------------------------------------

    def preempt(self, zone: str, name: str) -> None:
        with self.sim.cond:
            inst = self.instances.get((zone, name))
            if inst is not None and inst.model == "FLEX_START":
                raise SimError(f"cannot preempt instance {zone}/{name}: a FLEX_START VM is never preempted (gcp-facts "
                               "§18); its run ends at scheduling.maxRunDuration (sim.run_duration_scale shortens it)")
            if inst is not None and inst.model == RESERVATION:
                raise SimError(f"cannot preempt instance {zone}/{name}: a VM consuming a reservation is standard "
                               "provisioning, never preempted (gcp-facts §26); host maintenance still stops it")
            if inst is None or inst.status not in ("PROVISIONING", "STAGING", "RUNNING"):
                raise SimError(f"cannot preempt instance {zone}/{name}: it is "
                               f"{'absent' if inst is None else inst.status}; only a live instance can be preempted")
            op = self._new_op(zone, "compute.instances.preempted", self._path(zone, name), inst.id, system=True)
            if inst.runtime.metadata is not None:
                inst.runtime.metadata.set("instance/preempted", "TRUE")
            # With a preemption notice duration the VM keeps running (instance/preempted TRUE) until the soft-off.
            notice = inst.notice_seconds
            if not notice:
                self._set_status(inst, "STOPPING")
            entry = audit_entries.compute_system_event("compute.instances.preempted", project=self.sim.project, zone=zone, instance_name=name,
                                                       instance_id=inst.id)
            early = self.sim.audit_timing == "start"
        if early:
            self.sim.emit(entry)

        def after():
            if inst.termination_action == "DELETE":
                self._delete(inst, op, None)
            else:
                self._stopped(inst, op)
            if not early:
                self.sim.emit(entry)

        def soft_off():
            with self.sim.cond:
                if self.instances.get((zone, name)) is not inst or inst.status != "RUNNING":
                    return  # deleted or stopped during its notice
                self._set_status(inst, "STOPPING")
            self._shutdown(inst, self.sim.notice_seconds, then=after)
        if notice:
            self.sim.scheduler.call_later(notice, soft_off)
        else:
            self._shutdown(inst, self.sim.notice_seconds, then=after)

    def host_error(self, zone: str, name: str) -> None:
        with self.sim.cond:
            inst = self.instances.get((zone, name))
            if inst is None or inst.status not in ("STAGING", "RUNNING"):
                raise SimError(f"cannot inject a host error into instance {zone}/{name}: it is "
                               f"{'absent' if inst is None else inst.status}; only a running instance has a host")
            self._new_op(zone, "compute.instances.hostError", self._path(zone, name), inst.id, system=True)
            inst.runtime.crash()
            restart = bool(inst.body["scheduling"].get("automaticRestart")) and inst.model != "SPOT"
            self._set_status(inst, "TERMINATED")
            inst.body["lastStopTimestamp"] = rfc3339()
            if restart:
                self._set_status(inst, "STAGING")
                self.sim.scheduler.call_later(self.sim.op_delay, self._to_running, inst, inst.gen,
                                              self._new_op(zone, "compute.instances.automaticRestart",
                                                           self._path(zone, name), inst.id, system=True))
            entry = audit_entries.compute_system_event("compute.instances.hostError", project=self.sim.project,
                                                       zone=zone, instance_name=name, instance_id=inst.id)
        self.sim.emit(entry)

    def simulate_maintenance_event(self, zone: str, name: str) -> dict:
        """instances.simulateMaintenanceEvent (`gcloud compute instances simulate-maintenance-event`, gcp-facts §23):
        a VM that cannot live-migrate (every VM with GPUs) is terminated as its host maintenance policy says. A Spot
        VM is preempted (its notice, the soft-off, compute.instances.preempted); any other VM gets
        instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE, then after notice_seconds the soft-off and
        TERMINATED, with a compute.instances.terminateOnHostMaintenance entry. The operation ends at once."""
        with self.sim.cond:
            inst = self._get(zone, name)
            if inst.status != "RUNNING":
                raise compute_error(400, "resourceNotReady", f"The resource '{self._path(zone, name)}' is not ready: "
                                    f"a maintenance event is simulated on a RUNNING instance, not {inst.status}")
            op = self._new_op(zone, "simulateMaintenanceEvent", self._path(zone, name), inst.id)
            spot = inst.model == "SPOT"
        self.sim.scheduler.call_later(self.sim.op_delay, self._finish, op)
        if spot:
            self.preempt(zone, name)
            return dict(op.body)
        self.maintenance_event(zone, name, "TERMINATE_ON_HOST_MAINTENANCE")

        def terminate() -> None:
            with self.sim.cond:
                if self.instances.get((zone, name)) is not inst or inst.status != "RUNNING":
                    return
                self._set_status(inst, "STOPPING")
                self._shutdown(inst, self.sim.notice_seconds, then=lambda: self._stopped(inst, None))
                entry = audit_entries.compute_system_event(audit.TERMINATE_ON_HOST_MAINTENANCE,
                                                           project=self.sim.project, zone=zone, instance_name=name,
                                                           instance_id=inst.id)
            self.sim.emit(entry)

        self.sim.scheduler.call_later(self.sim.notice_seconds, terminate)
        return dict(op.body)

    def maintenance_event(self, zone: str, name: str, value: str) -> None:
        with self.sim.cond:
            inst = self.instances.get((zone, name))
            if inst is None or inst.runtime.metadata is None:
                raise SimError(f"instance {zone}/{name} is not running, so it has no metadata server to notify")
            inst.runtime.metadata.set("instance/maintenance-event", value)

    def usage(self, zone_or_region: str, accelerator: str, model: str | None, by_region: bool) -> int:
        """Live instances holding capacity in a zone or, by_region, quota in a region (`model`: the quota pool)."""
        return sum(
            1 for i in self.instances.values()
            if (region_of(i.zone) if by_region else i.zone) == zone_or_region
            and i.accelerator == accelerator and i.status in LIVE
            and (model is None or (quota_model(i.model) if by_region else i.model) == model)
            and not (by_region and i.model == RESERVATION)  # the reservation holds its quota, not its VMs
        )


_TERM = re.compile(r'^\s*\(?\s*([A-Za-z0-9_.\-]+)\s*(=|eq|!=|ne)\s*"?([^")]*)"?\s*\)?\s*$')


def _match_filter(item: dict, text: str) -> bool:
    """The filter forms our code uses on list calls: `field = value` terms joined by AND
    (e.g. `labels.respawn-job = "job-a" AND status = RUNNING`)."""
    for term in re.split(r"\s+AND\s+", text.strip()):
        m = _TERM.match(term)
        if not m:
            raise compute_error(400, "invalid", f"Invalid list filter expression '{text}'")
        field_path, op, value = m.groups()
        current = item
        for part in field_path.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        equal = str(current) == value if current is not None else False
        if (op in ("=", "eq")) != equal:
            return False
    return True
