"""A Compute Engine instance as the sim holds it, and what Compute checks of an insert's body and a list's filter.

Instance status: PROVISIONING -> STAGING -> RUNNING (insert/start), RUNNING -> STOPPING -> TERMINATED (stop, or
preemption with termination action STOP), deleted (delete, or preemption with termination action DELETE); PENDING
while a flex-start request waits for capacity (sim/compute.py).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from respawn import advice
from sim.core import NodeRecord, compute_error
from sim.nodes import NodeRuntime

if TYPE_CHECKING:
    from sim.compute_operations import Operation

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


def last(url: str) -> str:
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
        return (last(self.body["machineType"]),
                sum(a["acceleratorCount"] for a in self.body.get("guestAccelerators", [])))

    @property
    def run_seconds(self) -> float:
        """scheduling.maxRunDuration: how long one run lasts before the termination action; 0 = unlimited."""
        return duration_seconds(self.body.get("scheduling", {}).get("maxRunDuration"))

    @property
    def notice_seconds(self) -> float:
        """scheduling.preemptionNoticeDuration: how long instance/preempted is TRUE before the soft-off."""
        return duration_seconds(self.body.get("scheduling", {}).get("preemptionNoticeDuration"))

    @property
    def graceful_shutdown_seconds(self) -> float:
        """scheduling.gracefulShutdown: the guest's time to shut down on a user's stop or delete (never on a
        preemption); 0 when off."""
        graceful = self.body.get("scheduling", {}).get("gracefulShutdown") or {}
        if not graceful.get("enabled"):
            return 0.0
        return duration_seconds(graceful.get("maxDuration")) or DEFAULT_GRACEFUL_SHUTDOWN_SECONDS


def duration_seconds(value: Any) -> float:
    """A compute Duration ({"seconds": "120", "nanos": 0}, int64 seconds as a JSON string) in seconds."""
    if not value:
        return 0.0
    return float(value.get("seconds") or 0) + float(value.get("nanos") or 0) / 1e9


def check_notice_duration(scheduling: dict, model: str) -> None:
    seconds = duration_seconds(scheduling.get("preemptionNoticeDuration"))
    if seconds and model != "SPOT":
        raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.preemptionNoticeDuration': "
                                            "a preemption notice duration is allowed only with the SPOT provisioning model")
    if not 0 <= seconds <= MAX_NOTICE_SECONDS:
        raise compute_error(400, "invalid", "Invalid value for field 'resource.scheduling.preemptionNoticeDuration': "
                                            f"{seconds:g}s. Valid values are [0s, {MAX_NOTICE_SECONDS}s]")


def check_run_duration(body: dict, scheduling: dict, model: str) -> None:
    """What Compute refuses of a flex-start request (gcp-facts §18) and of a limited run time (§17), with 400."""
    run = duration_seconds(scheduling.get("maxRunDuration"))
    if model == "FLEX_START":
        machine_type = last(body["machineType"])
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
    wait = duration_seconds((body.get("params") or {}).get("requestValidForDuration"))
    if wait and not WAIT_SECONDS[0] <= wait <= WAIT_SECONDS[1]:
        raise compute_error(400, "invalid", f"Invalid value for field 'resource.params.requestValidForDuration': "
                                            f"{wait:g}s. Valid values are 0s or [{WAIT_SECONDS[0]}s, {WAIT_SECONDS[1]}s]")



_TERM = re.compile(r'^\s*\(?\s*([A-Za-z0-9_.\-]+)\s*(=|eq|!=|ne)\s*"?([^")]*)"?\s*\)?\s*$')


def match_filter(item: dict, text: str) -> bool:
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
