"""The Firestore layout and the job spec: the single definition shared by functions/ and the CLI. What the node
agent writes (nodes/{node}, node names and states) is defined in respawn.contract and used here.

Imports no cloud client library, so a Cloud Function and the CLI can both use it cheaply.

Layout:
    jobs/{job}                 {"spec": <JobSpec, user-written>, "status": <JobStatus, controller-written>,
                                "created_at": timestamp, "cancel_requested": bool}
    jobs/{job}/events/{event}  one lifecycle transition (JobEvent)
    nodes/{node}               the node agent's heartbeat (Heartbeat)
    capacity/{zone}~{accel}    a zone's recent capacity or quota refusal for one accelerator type (CapacityRecord)
"""

from __future__ import annotations

import enum
import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal, Sequence

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

# The node side of the layout (the heartbeat collection, node names and states) is the node contract's: the agent
# runs without pydantic, so it is defined there, in the standard library, and used here.
from .contract import LABEL_ATTEMPT, LABEL_JOB, MAX_ATTEMPT, NodeState, node_name  # noqa: F401 - re-exported
from .contract import (DEFAULT_INTERPRETER, DEFAULT_SETUP_TIMEOUT_SECONDS, RESPAWN_LABELS, STORE_URI_SHAPES,
                       SettingsError, StoreUri, check_cache_paths, workdir_digest)
from .contract import NODES_COLLECTION as NODES  # noqa: F401 - re-exported: the layout's collection names
from .contract import NODES_DATABASE  # noqa: F401 - re-exported: where NODES lives
from .contract import LOG_RETENTION_DAYS
from . import oci
from .deployment import RESPAWN_PREFIX
from .prices import shape_of

JOBS = "jobs"
EVENTS = "events"
CAPACITY = "capacity"
IDENTITIES = "identities"  # identities/{node service account email}: the job that holds it (a lease)
ADVICE = "advice"  # advice/{zone}~{machine shape}: capacity advice cached for every job (AdviceRecord)
STATS = "stats"  # capacity/{zone}~{accel}.stats: {model: ZoneStats}, what every job saw there

# Node names are `{job}-{attempt}` (respawn.contract.node_name), within GCE/TPU's 63 characters.
MAX_JOB_ID_LEN = 63 - 1 - len(str(MAX_ATTEMPT))
# How long lifecycle events are kept (deploy/ puts a TTL policy on `expire_at`).
EVENT_RETENTION = timedelta(days=30)

_JOB_ID = re.compile(r"^[a-z](?:[a-z0-9-]*[a-z0-9])?$")
_ZONE = re.compile(r"^[a-z]+(?:-[a-z]+)*[0-9]+-[a-z]$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9-]*$")
_IMAGE = re.compile(r"^(projects/[a-z][a-z0-9-]*/global/images/(family/)?[a-z][a-z0-9-]*|[a-z][a-z0-9-]*)$")
# The most GPU VMs one job may have (spec field `nodes`).
MAX_NODES = 64


class State(str, enum.Enum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    # A failure of the job's own (its trainer crashed, its agent went silent, its boot never reported): the node is
    # deleted and the next one waits out its backoff. Never PREEMPTED: the platform took nothing.
    RESTARTING = "RESTARTING"
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    INVALID = "INVALID"
    # The job's cost reached its budget.max_usd: its nodes were deleted (each saved its emergency checkpoint in its
    # soft-off). Terminal (never swept, no node kept), but resumable: `respawn jobs resume JOB --budget USD`.
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"

    @property
    def terminal(self) -> bool:
        return self in (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.INVALID, State.BUDGET_EXHAUSTED)


def _zone_name(v: str) -> str:
    if not _ZONE.match(v):
        raise ValueError(f"{v!r} is not a zone name such as us-central1-a")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class GpuAccelerator(_Strict):
    """A Compute Engine VM with GPUs attached."""

    kind: Literal["gpu"]
    machine_type: str = Field(description="e.g. a2-highgpu-1g, g2-standard-8, n1-standard-8")
    accelerator_type: str | None = Field(
        default=None, description="e.g. nvidia-tesla-t4; leave out for machine types with built-in GPUs (a2, a3, g2)"
    )
    accelerator_count: int = Field(default=1, ge=1, le=16)
    boot_image: str = Field(
        default="projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2404-nvidia-580",
        description="projects/P/global/images/family/F (the newest image of a family) or projects/P/global/images/NAME "
                    "(a bare NAME: an image of the job's project). The default, a Deep Learning VM base image (CUDA "
                    "12.9, NVIDIA driver 580, Ubuntu 24.04, python3 3.12), is supported until 2028-08-04 (gcp-facts "
                    "§12); the controller refuses a job whose image does not exist")
    boot_disk_gb: int = Field(default=200, ge=10, le=65536)

    @field_validator("machine_type", "accelerator_type")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _MACHINE_TYPE.match(v):
            raise ValueError(f"{v!r} is not a Compute Engine type name (lowercase letters, digits and hyphens)")
        return v

    @field_validator("boot_image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not _IMAGE.match(v):
            raise ValueError(
                f"{v!r} is not an image: use projects/P/global/images/NAME or projects/P/global/images/family/F"
            )
        return v


# A TPU queued resource's wait for capacity in one zone, in minutes (Respawn's bounds: Cloud TPU's own limits on
# valid_until_duration are not documented; gcp-facts §19), and its default.
QUEUE_WAIT_MINUTES = (1.0, 10080.0)
DEFAULT_QUEUE_WAIT_MINUTES = 30.0


class TpuAccelerator(_Strict):
    """A Cloud TPU VM."""

    kind: Literal["tpu"]
    accelerator_type: str = Field(description="e.g. v5litepod-8, v4-8")
    runtime_version: str = Field(description="e.g. v2-alpha-tpuv5-lite, tpu-ubuntu2204-base")
    queued_resource: bool | None = Field(
        default=None, description="obtain the node through a Cloud TPU queued resource (a request that waits for "
                                  "capacity; docs/job-spec.md, TPU queued resources); default: yes for a multi-host "
                                  "slice, no for a single host")
    queue_wait_minutes: float | None = Field(
        default=None, ge=QUEUE_WAIT_MINUTES[0], le=QUEUE_WAIT_MINUTES[1],
        description="how long a queued resource waits for capacity in a zone (its queueing_policy."
                    f"valid_until_duration; default {DEFAULT_QUEUE_WAIT_MINUTES:g}); then it is deleted and the next "
                    "zone is tried")

    @model_validator(mode="after")
    def _wait_needs_queue(self) -> "TpuAccelerator":
        if self.queue_wait_minutes is not None and self.queued_resource is False:
            raise ValueError("queue_wait_minutes is the wait of a queued resource: drop it, or drop "
                             "queued_resource: false")
        return self

    @property
    def queue_wait_seconds(self) -> float:
        """How long a queued resource may wait for capacity in one zone."""
        minutes = self.queue_wait_minutes if self.queue_wait_minutes is not None else DEFAULT_QUEUE_WAIT_MINUTES
        return minutes * 60

    @field_validator("accelerator_type")
    @classmethod
    def _tpu_type(cls, v: str) -> str:
        generation = re.match(r"^(?:tpu|v)([0-9]+)", v)
        if generation and int(generation.group(1)) >= 7:
            # "To use TPU7x, you must use Google Kubernetes Engine" (cloud.google.com/tpu/docs/tpu7x; gcp-facts §19),
            # and the Cloud TPU API, which Respawn drives, gets no new generations.
            raise ValueError(f"{v!r}: TPU7x (Ironwood) and later TPUs are offered only through Google Kubernetes "
                             "Engine, not the Cloud TPU API Respawn uses; choose v6e, v5p, v5litepod or v4")
        if not re.match(r"^v[0-9][a-z0-9]*-[0-9]+$", v):
            raise ValueError(f"{v!r} is not a TPU accelerator type such as v4-8 or v5litepod-16")
        return v

    @field_validator("runtime_version")
    @classmethod
    def _runtime(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9][a-z0-9.-]*$", v):
            raise ValueError(f"{v!r} is not a TPU runtime version such as tpu-ubuntu2204-base")
        return v


_Argv = list[Annotated[str, Field(min_length=1)]]


class Trainer(_Strict):
    command: _Argv = Field(min_length=1, description="argv, never a shell string; a leading python/python3 is "
                                                     "the interpreter")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(default=None, description="the code: gs://…/sha256-HEX.tar.gz, as written by "
                                                          "`respawn jobs register --workdir DIR`; the trainer's cwd")
    setup: list[Annotated[_Argv, Field(min_length=1)]] = Field(
        default_factory=list, description="argv commands run in the workdir once per node life, before the trainer")
    setup_timeout_seconds: int = Field(default=int(DEFAULT_SETUP_TIMEOUT_SECONDS), ge=1, le=86400,
                                       description="one setup command may run this long; then it is stopped and "
                                                   "the job fails, naming it")
    interpreter: str = Field(default=DEFAULT_INTERPRETER, min_length=1,
                             description="the trainer's Python: the image's python3, or a path such as "
                                         "/opt/conda/bin/python; Respawn's checkpoint library is installed into it")
    image: str | None = Field(
        default=None, description="the OCI image the trainer runs in (REGISTRY/PATH:TAG or @sha256:HEX; Docker Hub "
                                  "without a registry host); `respawn jobs register` pins a tag to its digest")
    cache: list[str] = Field(default_factory=list,
                             description="what setup produces (.venv, ~/.cache/pip): archived once after setup ran, "
                                         "restored on a fresh node instead of running setup (same inputs only)")

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError("must be an argv list such as [python, train.py], not a shell string")
        return v

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_argvs(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError("must be a list of argv commands such as [[pip, install, -r, requirements.txt]], "
                             "not a shell string")
        if not isinstance(v, list):
            return v
        commands = []
        for i, command in enumerate(v):
            if isinstance(command, str):
                raise ValueError(f"[{i}] must be an argv list such as [pip, install, -r, requirements.txt], "
                                 "not a shell string")
            if isinstance(command, dict):  # the stored form: Firestore holds no array directly inside an array
                if set(command) != {"argv"}:
                    raise ValueError(f"[{i}] must be an argv list, or {{argv: [...]}} as a Firestore document "
                                     "stores it")
                command = command["argv"]
            commands.append(command)
        return commands

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            StoreUri.parse(v)
        except ValueError:
            raise ValueError("must be a gs:// (or file:/// for local runs) archive written by "
                             "`respawn jobs register --workdir DIR`") from None
        try:
            workdir_digest(v)
        except SettingsError as exc:
            raise ValueError(f"{exc}; `respawn jobs register job.yaml --workdir DIR` packs and uploads it") from None
        return v

    @field_validator("cache")
    @classmethod
    def _cache(cls, v: list[str], info: ValidationInfo) -> list[str]:
        try:
            paths = list(check_cache_paths(v))
        except SettingsError as exc:
            raise ValueError(str(exc).removeprefix("cache: ")) from None
        if paths and not info.data.get("setup"):
            raise ValueError("keeps what trainer.setup produces: add the setup commands, or leave cache out")
        if paths and info.data.get("image"):
            raise ValueError("not with trainer.image: build what setup makes into the image (a node keeps its pulled "
                             "layers), or leave cache out")
        return paths

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                oci.parse(v)
            except oci.BadReference as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("interpreter")
    @classmethod
    def _interpreter(cls, v: str) -> str:
        if "/" in v and not v.startswith("/"):
            raise ValueError(f"{v!r}: use a program name found on PATH (python3) or an absolute path")
        if any(c.isspace() for c in v):
            raise ValueError(f"{v!r}: one program, no arguments (put those in trainer.command)")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name.startswith("RESPAWN_"):
                raise ValueError(f"{name!r}: RESPAWN_* variables are set by the node agent")
        return v


ZoneOrder = Literal["next_zone", "same_zone", "in_order"]  # functions/recovery.py


class Placement(_Strict):
    cooldown_seconds: int = Field(default=600, ge=0, description="how long a zone that refused is skipped")
    strategy: ZoneOrder | None = Field(
        default=None, description="the order of the zones after a loss (docs/job-spec.md, placement.strategy); "
                                  "default next_zone (in_order when avoid_preempting_zone is false)")
    avoid_preempting_zone: bool = Field(default=True, description="the older spelling of strategy: next_zone (true) "
                                                                  "or in_order (false)")
    on_demand_fallback: bool = Field(default=False, description="fall back to standard (on-demand) VMs")
    fallback_after_failures: int = Field(default=3, ge=1, description="consecutive failed attempts before falling back")
    max_backoff_seconds: int = Field(default=900, ge=1, description="cap of the wait when every zone refused")
    rank: Literal["advice"] | None = Field(
        default=None, description="advice: a Spot GPU node's zones are tried in the order of Compute Engine's "
                                  "capacity advice (obtainability, then estimated uptime), among the zones listed "
                                  "(docs/job-spec.md, placement.rank); unset: as listed")

    @model_validator(mode="after")
    def _one_order(self) -> "Placement":
        if "avoid_preempting_zone" in self.model_fields_set and self.strategy is not None:
            raise ValueError(f"strategy {self.strategy} and avoid_preempting_zone {self.avoid_preempting_zone} both "
                             "choose the zone order: keep strategy alone")
        return self


class Preemptions(_Strict):
    """`max` preemptions within the last `window_hours`."""

    max: int = Field(ge=1, le=100_000, description="preemptions allowed within the window")
    window_hours: float = Field(gt=0, le=24 * 90, description="the sliding window, in hours")

    def exceeded(self, times: Sequence[datetime], now: datetime) -> bool:
        """More than `max` of `times` fall within the window ending `now`."""
        since = now - timedelta(hours=self.window_hours)
        return sum(1 for t in times if t > since) > self.max


class PreemptionRate(Preemptions):
    """More than `max` preemptions within the last `window_hours` → `action` (docs/job-spec.md)."""

    action: Literal["alert", "backoff", "fail"] = Field(
        default="alert", description="alert: one alert per window; backoff: also wait before the next node, "
                                     "exponentially in the preemptions over max; fail: end the job FAILED")


Model = Literal["spot", "preemptible", "flex-start", "standard", "reservation"]
DEFAULT_MODEL: Model = "spot"  # a spec's, and a status's that names none (written before tiers existed)
# The machine series a flex-start VM may be: "all accelerator-optimized machine types (except A4X and G4) and H4D"
# (Google's "About flex-start VMs", gcp-facts §18).
FLEX_START_SERIES = frozenset({"a2", "a3", "a4", "g2", "h4d"})
# A specific reservation's name, or a shared one's path (projects/OWNER/reservations/NAME; gcp-facts §26).
_RESERVATION = re.compile(r"^(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Flex-start VMs run for this long (scheduling.maxRunDuration, 600-604800 s; docs/gcp-facts.md §18)...
FLEX_START_RUN_HOURS = (1 / 6, 168)
# ...and its request waits for capacity within these bounds (params.requestValidForDuration, 90-7200 s).
FLEX_START_WAIT_MINUTES = (1.5, 120.0)
DEFAULT_FLEX_START_WAIT_MINUTES = 30.0


class Tier(_Strict):
    """One way a job accepts capacity, in the order of `provisioning` as a list (docs/job-spec.md, "Provisioning
    tiers"): the next node takes the first tier whose rules do not say move on."""

    model: Model
    after_refusals: int | None = Field(
        default=None, ge=1, le=10_000,
        description="move on to the next tier after this many refusals in a row (capacity or quota, any zone); "
                    "default 3 on every tier but the last")
    after_preemptions: Preemptions | None = Field(
        default=None, description="move on while the job had more than max preemptions within window_hours")
    while_budget_below: float | None = Field(
        default=None, gt=0, le=1, description="take this tier only while the job has spent less than this share of "
        "budget.max_usd (0.8: until 80 %); past it the tier is passed over, as if it were not listed")
    max_run_hours: float | None = Field(
        default=None, ge=FLEX_START_RUN_HOURS[0], le=FLEX_START_RUN_HOURS[1],
        description=f"flex-start only: how long the VM runs (scheduling.maxRunDuration, 10 min to "
                    f"{FLEX_START_RUN_HOURS[1]} h; default the most); the job checkpoints before the end and a new "
                    "node continues")

    wait_minutes: float | None = Field(
        default=None, ge=FLEX_START_WAIT_MINUTES[0], le=FLEX_START_WAIT_MINUTES[1],
        description="flex-start only: how long a request waits for capacity (params.requestValidForDuration, "
                    f"{FLEX_START_WAIT_MINUTES[0]:g}-{FLEX_START_WAIT_MINUTES[1]:g} min; default "
                    f"{DEFAULT_FLEX_START_WAIT_MINUTES:g}); unanswered, it counts as a refusal")

    reservation: str | None = Field(
        default=None, max_length=200,
        description="reservation only: the specific reservation the node consumes, by name (or "
                    "projects/OWNER/reservations/NAME for one another project shares)")
    zone: str | None = Field(default=None, description="reservation only: the reservation's zone, one of the job's "
                                                       "zones (a reservation is zonal)")
    ends_at: datetime | None = Field(
        default=None, description="reservation only: the end of a calendar-mode or AI Hypercomputer reservation "
        "(RFC 3339 with its offset): its nodes are reservation-bound and deleted then; the end is a planned stop and "
        "the next tier takes over")

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        """`spot` is short for {model: spot}."""
        return {"model": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _model_fields(self) -> "Tier":
        for name, model in (("max_run_hours", "flex-start"), ("wait_minutes", "flex-start"),
                            ("reservation", "reservation"), ("zone", "reservation"), ("ends_at", "reservation")):
            if getattr(self, name) is not None and self.model != model:
                raise ValueError(f"{name} applies to {model} tiers only, not {self.model}")
        if self.model == "reservation":
            if not self.reservation or not self.zone:
                raise ValueError("a reservation tier names its reservation and the reservation's zone: "
                                 "{model: reservation, reservation: NAME, zone: ZONE}")
            if not _RESERVATION.match(self.reservation):
                raise ValueError(f"{self.reservation!r} is not a reservation: a name, or "
                                 "projects/OWNER/reservations/NAME for a shared one")
            if self.ends_at is not None and self.ends_at.tzinfo is None:
                raise ValueError(f"ends_at {self.ends_at.isoformat()} has no UTC offset: write it as "
                                 "2026-12-20T00:00:00Z (the reservation's end, as Google Cloud shows it)")
        return self

    @property
    def request_valid_minutes(self) -> float:
        """How long a flex-start request waits for capacity, in minutes."""
        return self.wait_minutes if self.wait_minutes is not None else DEFAULT_FLEX_START_WAIT_MINUTES

    @property
    def run_hours(self) -> float | None:
        """A flex-start VM's run duration; None for the other models (no limit)."""
        if self.model != "flex-start":
            return None
        return self.max_run_hours if self.max_run_hours is not None else FLEX_START_RUN_HOURS[1]


# Refusals in a row after which a tier without after_refusals moves on (the older fallback_after_failures' default).
DEFAULT_TIER_REFUSALS = 3

# Preemption times a status keeps for the rate (the newest; more than any sensible `max` + 1).
MAX_PREEMPTION_TIMES = 200
# How much of a node's console a status and an alert keep (the end of it).
CONSOLE_TAIL_CHARS = 4000
# max_restarts: the old name of max_failures (docs/job-spec.md).
DEPRECATED_MAX_RESTARTS = ("max_restarts is the old name of max_failures (crashes, boot failures); preemptions no "
                           "longer count against it: rename it to max_failures (and see max_preemptions)")


class Logs(_Strict):
    """The job's shipped logs (respawn.contract.LogChunk): how long they are kept."""

    retention_days: int = Field(
        default=LOG_RETENTION_DAYS, ge=1, le=3650,
        description="the controller's sweep deletes a log chunk this many days after it was written (once a day per "
                    "job, from the job's own prefix)")
    cloud_logging: bool = Field(
        default=True,
        description="the agent also writes every shipped line (setup, trainer, agent) to Cloud Logging as entries "
                    "labelled respawn_job, respawn_attempt, respawn_node, respawn_rank (Cloud Logging's ingestion "
                    "is billed past its free allotment; false: the bucket's copy only)")


class Budget(_Strict):
    """The most the job's nodes may cost (docs/job-spec.md, budget): alerts at 50 % and 80 %, and at the cap the
    job is checkpointed and stopped (BUDGET_EXHAUSTED)."""

    max_usd: float = Field(gt=0, le=10_000_000, description="USD, as priced by Respawn's ledger (respawn/prices.py: "
                                                            "the Cloud Billing Catalog, else a dated offline table)")


class JobSpec(_Strict):
    """What a user writes to register a job. Unknown fields are errors."""

    id: str = Field(min_length=1, max_length=MAX_JOB_ID_LEN)
    accelerator: Annotated[GpuAccelerator | TpuAccelerator, Field(discriminator="kind")]
    provisioning: Model = Field(
        default=DEFAULT_MODEL, description="the model of the job's nodes; a list (tiers) names the ways it accepts capacity, "
                                    "in order, and is stored here as its first model and in tiers")
    tiers: list[Tier] | None = Field(
        default=None, min_length=1, max_length=4,
        description="provisioning as a list: the ways the job accepts capacity, in order, with when to move on; "
                    "none: provisioning alone (and standard after placement.fallback_after_failures refusals with "
                    "placement.on_demand_fallback)")
    termination_action: Literal["STOP", "DELETE"] | None = Field(
        default=None, validate_default=True, description="GPU Spot VMs only; default STOP"
    )
    notice_seconds: Literal[0, 120] = Field(
        default=0, description="GPU Spot VMs only: the preemption notice before the soft-off (Compute Engine's "
                               "scheduling.preemptionNoticeDuration, 0 or 120 s); the emergency save and the "
                               "replacement's head start use it")
    # Several nodes (issue #16): declared after accelerator and provisioning, which their checks read. One node is
    # the nodes=1 case of the same fields, not a second kind of job.
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, description="GPU VMs of the job, all in one zone")
    min_nodes: int | None = Field(
        default=None, ge=1, validate_default=True,
        description="the job may run with this many nodes while replacements are pending; default nodes (every "
                    "node needed); stored resolved")
    on_demand_nodes: int = Field(default=0, ge=0, description="how many of the nodes are standard (on-demand) VMs; "
                                                              "the rest use provisioning (spot or preemptible)")
    spare_nodes: int = Field(default=0, ge=0, le=MAX_NODES,
                             description="GPU jobs: extra nodes kept booted and set up in the job's zone, waiting; "
                                         "a lost node's place goes to a ready spare at once, and its replacement "
                                         "becomes the next spare")
    zones: list[Annotated[str, AfterValidator(_zone_name)]] = Field(min_length=1, description="ordered by preference")
    trainer: Trainer
    checkpoint_uri: str
    max_failures: int = Field(
        default=3, ge=0, le=10_000,
        description="failures (a crashed trainer, a node whose agent never started) the job recovers from; one "
                    "more ends it FAILED. Preemptions never count")
    max_preemptions: int | None = Field(default=None, ge=0, le=1_000_000,
                                        description="preemptions the job recovers from; none: unlimited")
    preemption_rate: PreemptionRate | None = None
    placement: Placement = Field(default_factory=Placement)
    labels: dict[str, str] = Field(default_factory=dict)
    budget: Budget | None = None
    logs: Logs = Field(default_factory=Logs)

    @model_validator(mode="before")
    @classmethod
    def _max_restarts(cls, data: Any) -> Any:
        """max_restarts, the old name of max_failures, is read as max_failures (and stored so)."""
        if not isinstance(data, dict) or "max_restarts" not in data:
            return data
        data = dict(data)
        old = data.pop("max_restarts")
        if "max_failures" in data:
            raise ValueError("max_restarts and max_failures both given: max_restarts is the old name of "
                             "max_failures; keep max_failures alone")
        if old is not None:
            if isinstance(old, bool) or not isinstance(old, int) or not 0 <= old <= 10_000:
                raise ValueError(f"max_restarts (the old name of max_failures): {old!r} is not a whole number "
                                 "from 0 to 10000")
            data["max_failures"] = old
        return data

    @model_validator(mode="before")
    @classmethod
    def _tiers(cls, data: Any) -> Any:
        """provisioning as a list is read as its tiers, provisioning being the first one's model."""
        if not isinstance(data, dict) or not isinstance(data.get("provisioning"), list):
            return data
        data = dict(data)
        given = data.pop("provisioning")
        if data.get("tiers") is not None:
            raise ValueError("provisioning is a list and tiers is given: the list is the tiers; keep one of them")
        data["tiers"] = given
        first = given[0] if given else None
        model = first.get("model") if isinstance(first, dict) else first
        if isinstance(model, str):
            data["provisioning"] = model
        return data

    @field_validator("tiers")
    @classmethod
    def _tier_list(cls, v: list[Tier] | None, info: ValidationInfo) -> list[Tier] | None:
        if v is None:
            return v
        models = [t.model for t in v]
        if len(set(models)) != len(models):
            raise ValueError(f"{', '.join(models)}: each model at most once")
        last = v[-1]
        if last.after_refusals is not None or last.after_preemptions is not None:
            raise ValueError(f"the last tier ({last.model}) has no next tier to move on to: drop its after_refusals "
                             "and after_preemptions")
        if info.data.get("provisioning") not in (None, models[0]):
            raise ValueError(f"provisioning is {info.data.get('provisioning')} but the first tier is {models[0]}")
        return v

    @field_validator("provisioning", "tiers")
    @classmethod
    def _gpu_only_flex_start(cls, v: Any, info: ValidationInfo) -> Any:
        models = [t.model for t in v] if isinstance(v, list) else [v]
        accelerator = info.data.get("accelerator")
        if "flex-start" in models and getattr(accelerator, "kind", None) == "tpu":
            # Cloud TPU's flex-start is a queued resource's provisioningModel in its v2alpha1 API only (gcp-facts §19).
            raise ValueError("flex-start TPUs are not offered: Cloud TPU asks for them only in its v2alpha1 API, not the "
                             "v2 API Respawn drives; a TPU job takes spot, preemptible or standard")
        if "reservation" in models and getattr(accelerator, "kind", None) == "tpu":
            raise ValueError("reservation tiers are Compute Engine VMs: a TPU job takes spot, preemptible or standard")
        if "preemptible" in models and getattr(accelerator, "queued_resource", None) is True:
            raise ValueError("a queued resource's tiers are spot and guaranteed (standard): a preemptible TPU is "
                             "created directly (accelerator.queued_resource: false)")
        return v

    @property
    def provisioning_tiers(self) -> list[Tier]:
        """The ways the job accepts capacity, in order: `tiers`, else provisioning alone, or provisioning then
        standard after placement.fallback_after_failures refusals (placement.on_demand_fallback)."""
        if self.tiers is not None:
            return [t if t is self.tiers[-1] or t.after_refusals is not None
                    else t.model_copy(update={"after_refusals": DEFAULT_TIER_REFUSALS}) for t in self.tiers]
        if self.placement.on_demand_fallback and self.provisioning != "standard":
            return [Tier(model=self.provisioning, after_refusals=self.placement.fallback_after_failures),
                    Tier(model="standard")]
        return [Tier(model=self.provisioning)]

    @field_validator("id")
    @classmethod
    def _job_id(cls, v: str) -> str:
        if not _JOB_ID.match(v):
            raise ValueError(
                f"{v!r} is not a valid job id: use lowercase letters, digits and hyphens, "
                "start with a letter and end with a letter or digit"
            )
        return v

    @field_validator("termination_action")
    @classmethod
    def _termination_action(cls, v: str | None, info: ValidationInfo) -> str | None:
        accelerator, provisioning = info.data.get("accelerator"), info.data.get("provisioning")
        gpu_spot = getattr(accelerator, "kind", None) == "gpu" and provisioning == "spot"
        if v is None:
            return "STOP" if gpu_spot else None
        if accelerator is not None and provisioning is not None and not gpu_spot:
            raise ValueError("applies only to GPU Spot VMs (accelerator.kind gpu, provisioning spot)")
        return v

    @field_validator("notice_seconds")
    @classmethod
    def _notice_seconds(cls, v: int, info: ValidationInfo) -> int:
        accelerator, provisioning = info.data.get("accelerator"), info.data.get("provisioning")
        if v and accelerator is not None and provisioning is not None and not (
                accelerator.kind == "gpu" and provisioning == "spot"):
            raise ValueError("a preemption notice duration exists only for GPU Spot VMs (accelerator.kind gpu, "
                             "provisioning spot); leave notice_seconds at 0")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: int, info: ValidationInfo) -> int:
        accelerator = info.data.get("accelerator")
        if v != 1 and getattr(accelerator, "kind", None) == "tpu":
            raise ValueError(
                f"{v}: a TPU job is one node, which may be a multi-host slice such as v5litepod-16; for more chips "
                "pick a larger accelerator.accelerator_type and leave nodes at 1"
            )
        return v

    @field_validator("min_nodes")
    @classmethod
    def _min_nodes(cls, v: int | None, info: ValidationInfo) -> int | None:
        nodes = info.data.get("nodes")
        if nodes is None:  # nodes itself is invalid and named; nothing to compare with
            return v
        if v is None:
            return nodes  # stored resolved, so a reader never has to know the default
        if v > nodes:
            raise ValueError(f"{v} is more than nodes ({nodes}); min_nodes is the fewest nodes the job may run "
                             "with while replacements are pending, at most nodes")
        return v

    @field_validator("on_demand_nodes")
    @classmethod
    def _on_demand_nodes(cls, v: int, info: ValidationInfo) -> int:
        nodes, provisioning = info.data.get("nodes"), info.data.get("provisioning")
        if v and provisioning == "standard":
            raise ValueError(f"{v}: with provisioning standard every node is on-demand already; set provisioning "
                             "spot (or preemptible) to mix on-demand and Spot nodes, or leave on_demand_nodes out")
        if nodes is not None and v > nodes:
            raise ValueError(f"{v} is more than nodes ({nodes}); on_demand_nodes counts toward nodes, the rest "
                             "are Spot")
        return v

    @field_validator("spare_nodes")
    @classmethod
    def _spare_nodes(cls, v: int, info: ValidationInfo) -> int:
        accelerator, nodes = info.data.get("accelerator"), info.data.get("nodes")
        if v and getattr(accelerator, "kind", None) == "tpu":
            raise ValueError(f"{v}: spares are GPU VMs that join a generation of the job's nodes; a TPU job is one "
                             "node (its slice): leave spare_nodes at 0")
        if nodes is not None and nodes + v > MAX_NODES:
            raise ValueError(f"{v}: nodes ({nodes}) and spare_nodes together exceed {MAX_NODES}, the most VMs of one "
                             "job")
        return v

    @property
    def slots(self) -> int:
        """The job's member slots: its nodes and its spares (each slot holds at most one node at a time)."""
        return self.nodes + self.spare_nodes

    @field_validator("zones")
    @classmethod
    def _zones(cls, v: list[str]) -> list[str]:
        first: dict[str, int] = {}
        for i, zone in enumerate(v):
            if zone in first:
                raise ValueError(f"zone {zone!r} at position {i} repeats position {first[zone]}")
            first[zone] = i
        return v

    @field_validator("checkpoint_uri")
    @classmethod
    def _checkpoint_uri(cls, v: str) -> str:
        try:
            uri = StoreUri.parse(v)
        except ValueError:
            raise ValueError(f"must be {STORE_URI_SHAPES}") from None
        if uri.scheme == StoreUri.GS:
            if not _BUCKET.match(uri.bucket):
                raise ValueError(f"{uri.bucket!r} is not a valid Cloud Storage bucket name")
            if (uri.path.rstrip("/") + "/").startswith(RESPAWN_PREFIX + "/"):
                raise ValueError(f"gs://{uri.bucket}/{RESPAWN_PREFIX}/ is Respawn's own folder (the release and the "
                                 "workdir archives, which nodes may only read): put the checkpoints under another "
                                 "prefix")
        return v.rstrip("/")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if key in RESPAWN_LABELS:
                raise ValueError(f"label {key!r} is set by Respawn itself (it writes {', '.join(RESPAWN_LABELS)})")
            if not _LABEL_KEY.match(key):
                raise ValueError(f"label key {key!r}: lowercase letters, digits, _ and -, starting with a letter")
            if not _LABEL_VALUE.match(value):
                raise ValueError(f"label {key!r} value {value!r}: at most 63 lowercase letters, digits, _ and -")
        return v

    @model_validator(mode="after")
    def _flex_start_machine(self) -> "JobSpec":
        """A flex-start tier on a machine type Compute Engine offers it on: refused here, in one line, rather than by
        Compute at every create."""
        machine_type = getattr(self.accelerator, "machine_type", None)
        if (machine_type and machine_type.split("-")[0] not in FLEX_START_SERIES
                and "flex-start" in [t.model for t in self.tiers or []] + [self.provisioning]):
            raise ValueError(f"provisioning: flex-start does not run {machine_type}: Google offers it on "
                             "accelerator-optimized machine types (A2, A3, A4, G2; not A4X or G4) and H4D only; "
                             "choose one (e.g. g2-standard-8 for one L4) or another model for this job")
        return self

    @model_validator(mode="after")
    def _reservation_tier(self) -> "JobSpec":
        """A reservation is a tier, named, in one of the job's zones."""
        if self.tiers is None and self.provisioning == "reservation":
            raise ValueError("provisioning: a reservation is a tier that names it: provisioning: [{model: reservation, "
                             "reservation: NAME, zone: ZONE}, ...]")
        for t in self.tiers or []:
            if t.zone is not None and t.zone not in self.zones:
                raise ValueError(f"provisioning: the reservation's zone {t.zone} is not one of the job's zones "
                                 f"({', '.join(self.zones)})")
        return self

    @model_validator(mode="after")
    def _fields_agree(self) -> "JobSpec":
        """What one field allows that another rules out. (Whether the job's nodes, as the control plane composes
        them, fit the platform's limits is respawn.control.composition's check, at registration.)"""
        errors = []
        if self.budget is not None and shape_of(self.accelerator) is None:
            # A cap the ledger cannot count (a type whose vCPUs, memory or chips respawn/prices.py does not know)
            # would never stop the job.
            name = getattr(self.accelerator, "machine_type", None) or self.accelerator.accelerator_type
            errors.append((("budget",), f"Respawn cannot price {name} (respawn/prices.py knows the predefined n1 and "
                                        "n2 types, g2, a2-highgpu, a2-megagpu and a3-highgpu, and TPU v4, v5e, v5p "
                                        "and v6e): drop the budget or pick one of those"))
        if self.budget is None and any(t.while_budget_below is not None for t in self.tiers or ()):
            errors.append((("provisioning",), "while_budget_below is a share of the budget: give budget.max_usd"))
        if self.tiers is not None and self.placement.on_demand_fallback:
            errors.append((("placement", "on_demand_fallback"), "the tiers say where capacity comes from: list "
                                                                 "standard as the last tier instead"))
        if errors:
            raise ValidationError.from_exception_data("JobSpec", [
                InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}),
                                 loc=loc, input=None) for loc, message in errors])
        return self

    def to_doc(self) -> dict[str, Any]:
        """The spec as a Firestore document: setup commands as {argv: [...]} maps (no arrays inside arrays)."""
        doc = self.model_dump(mode="json")
        doc["trainer"]["setup"] = [{"argv": argv} for argv in doc["trainer"]["setup"]]
        return doc


class SpecError(ValueError):
    """A job spec failed validation; `errors` holds one line per problem, each naming the field path."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid job spec:\n" + "\n".join(f"  - {e}" for e in errors))


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("gpu", "tpu") and path.endswith("accelerator"):
            continue  # the discriminated union's branch name is noise to a user
        else:
            path += ("." if path else "") + str(part)
    return path or "(job)"


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; unknown fields are not allowed)"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid":
        return "kind must be 'gpu' or 'tpu'"
    if kind == "union_tag_not_found":
        return "kind is required: 'gpu' or 'tpu'"
    if kind == "too_short":
        return "must not be empty"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def deprecations(data: Any) -> list[str]:
    """What a spec as written uses that is deprecated: one warning line each (`respawn jobs validate` prints them)."""
    if isinstance(data, dict) and "max_restarts" in data:
        return [DEPRECATED_MAX_RESTARTS]
    return []


def parse_spec(data: Any) -> JobSpec:
    """Validate a job spec; raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError([f"(job): expected a mapping of fields, got {type(data).__name__}"])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(error_lines(exc)) from None


def error_lines(exc: ValidationError) -> list[str]:
    """One `field.path: what is wrong` line per validation error."""
    return [f"{_field_path(e['loc'])}: {_describe(e)}" for e in exc.errors()]


def parse_node_name(name: str) -> tuple[str, int] | None:
    """`{job}-{attempt}` → (job, attempt), or None for a name Respawn did not make."""
    job, sep, attempt = name.rpartition("-")
    if not sep or not attempt.isdigit() or not _JOB_ID.match(job) or len(job) > MAX_JOB_ID_LEN:
        return None
    return job, int(attempt)


def capacity_doc_id(zone: str, accelerator_type: str) -> str:
    return f"{zone}~{accelerator_type}"


class _Record(BaseModel):
    # Controller-written records tolerate fields written by newer versions.
    model_config = ConfigDict(extra="allow")


class JobCounters(_Record):
    """The job-wide record every member slot's decision reads and adds to (functions/decide.py)."""

    restarts: int = 0  # every recovery, failures and preemptions alike (shown by the CLI and the demo)
    failures: int = 0  # losses counted against spec.max_failures: crashes, boot failures, stale heartbeats
    preemptions: int = 0  # losses the platform caused (preemption, host error, node stopped or deleted)
    failure_streak: int = 0  # failures since training last advanced: the exponent of the backoff before a create
    preempted_times: list[datetime] = Field(default_factory=list)  # recent preemptions (spec.preemption_rate)
    rate_exceeded_at: datetime | None = None  # when the preemption rate was last exceeded (one alert per window)
    last_committed_step: int | None = None
    last_step: int | None = None  # the newest step a heartbeat reported
    total_steps: int | None = None
    zones_used: list[str] = Field(default_factory=list)
    updated_at: datetime | None = None
    revision: int = 0  # bumped by every controller write: the optimistic-concurrency check of reconcile


class _Loss(_Record):
    """Of the last loss, and of the recovery from it (a member's own, and the job's: its first member lost)."""

    recovering: bool = False  # a node was lost and its replacement has not run yet
    last_cause: str | None = None
    preempted_zone: str | None = None
    preempted_at: datetime | None = None
    steps_lost: int | None = None  # at the last loss: last step seen minus the newest committed step
    exit_code: int | None = None
    # A failure's: the last line of its trainer's (or setup command's) error, e.g. "ValueError: bad learning rate"
    # (respawn.losswords.last_error of the heartbeat's output_tail).
    last_error: str | None = None
    # A noticed node's emergency save, as its final heartbeat told it: {"state": committed | failed | abandoned |
    # not-started | saving | idle, "step": int | None, "reason": str | None} (respawn.losswords.emergency_sentence).
    emergency: dict[str, Any] | None = None


class Leaving(_Record):
    node: str
    zone: str
    attempt: int
    until: datetime  # the notice's end: the VM is off by then


class BilledLife(_Record):
    """The life of a slot's node the ledger is pricing (functions/costs.py): from when the controller saw it
    RUNNING, at its price an hour, until the controller records its end."""

    node: str
    started_at: datetime | None = None  # the node's node_started_at: a restart in place is another life
    since: datetime
    usd_per_hour: float
    on_demand_usd_per_hour: float


class CostLedger(_Record):
    """jobs/{job}.status.cost: what the job's node lives cost so far, kept as it goes so that no reconcile reads the
    events: the closed lives' cost, plus (respawn.ledger.spent) each open life's hours × its rate."""

    closed_usd: float = 0.0
    closed_on_demand_usd: float = 0.0  # the same lives priced on demand
    note: str | None = None  # which prices (respawn.prices.Book.note) the newest life was priced with
    unpriced: str | None = None  # why a life could not be priced (a machine type or region without prices)
    alerted_percent: int = 0  # the budget alert last sent (50, 80, 100), once each per cap
    stopped_at_budget_usd: float | None = None  # the cap a BUDGET_EXHAUSTED job stopped at: it resumes above it


class MemberStatus(_Loss):
    """One member slot of a job (a one-node job has one): the life of its current node."""

    @model_validator(mode="before")
    @classmethod
    def _job_fields_stay_with_the_job(cls, data: Any) -> Any:
        """A slot stored before the one shape carried the job's fields too, at their blank values: dropped."""
        if cls is MemberStatus and isinstance(data, dict) and {"members", "restarts"} & data.keys():
            return {k: v for k, v in data.items() if k in MemberStatus.model_fields or k not in JobStatus.model_fields}
        return data

    state: State = State.PENDING
    message: str = ""
    attempt: int = 0  # the attempt whose node name was last committed for this slot; node = {job}-{attempt}
    node: str | None = None
    zone: str | None = None
    provisioning: str | None = None  # the model of the node: spot, preemptible or standard (fallback)
    # Of the current attempt's create call ("starting": a restart in place issued, its outcome not yet recorded).
    create_state: Literal["pending", "starting", "created", "failed"] | None = None
    node_started_at: datetime | None = None  # when the current node was created or restarted in place
    tried_zones: list[str] = Field(default_factory=list)  # zones that refused during the current placement round
    consecutive_failures: int = 0  # refusals in a row (the backoff, the on-demand fallback)
    next_attempt_at: datetime | None = None
    in_place_restarts: int = 0  # restarts in place of the current node (STOP-terminated Spot VM)
    boot_failures: int = 0  # boots in a row that never heartbeat (two end the job)
    console_tail: str | None = None  # the end of the serial console of the last node that never heartbeat
    # Its internal address once the API showed it, and the generation its node was last given (multi-node jobs).
    address: str | None = None
    generation_sent: int = 0
    # The node this slot's current one replaced during its notice, still saving its emergency checkpoint; deleted
    # (when still there) once `until` has passed, and never an orphan before.
    leaving: Leaving | None = None
    # A flex-start node: when its run duration ends (seen running + max_run_hours, so at most a poll late): a loss
    # near it is the planned end of the run (losses.RUN_ENDED), not a preemption.
    run_ends_at: datetime | None = None
    running_at: datetime | None = None  # when the API first said the current node runs (a recovery's breakdown)
    billing: BilledLife | None = None  # the node's life as the cost ledger prices it (functions/costs.py)


class SlotStatus(MemberStatus, JobCounters):
    """A member slot as decide.decide sees it: its own node's life and the job's counters (functions/job.py)."""


class JobStatus(JobCounters, _Loss):
    """jobs/{job}.status: the job, and its member slots. A one-node job is one slot; the top level sums the slots
    up (state, node: the master's, zone, the current recovery) for the CLI, the alerts and Firestore's queries."""

    state: State = State.PENDING
    message: str = ""
    attempt: int = 0  # the newest attempt of any slot: every node of the job has its own number
    node: str | None = None
    zone: str | None = None
    provisioning: str | None = None
    tried_zones: list[str] = Field(default_factory=list)  # zones the job tried in its current placement round
    members: list[MemberStatus] = Field(default_factory=list)
    generation: dict[str, Any] | None = None  # the newest generation (respawn.contract.Generation, as JSON data)
    moving: bool = False  # the whole job is leaving its zone: every member is deleted, then placed anew
    # When the control plane first saw a member's trainer crash in the current generation while others still ran
    # (functions/job.py: the generation restarts once every member has ended, or CRASH_SETTLE_SECONDS after this).
    crash_seen_at: datetime | None = None
    cost: CostLedger = Field(default_factory=CostLedger)

    @model_validator(mode="before")
    @classmethod
    def _one_shape(cls, data: Any) -> Any:
        """A status stored before the one shape (version 0.x): a one-node job's node fields at the top level become
        its one slot (none before its first node)."""
        if not isinstance(data, dict) or data.get("members"):
            return data
        own = set(MemberStatus.model_fields) - set(JobStatus.model_fields)
        if not own & data.keys():
            return data
        top = {k: v for k, v in data.items() if k not in own}
        return {**top, "members": [{k: data[k] for k in MemberStatus.model_fields if k in data}] if data.get("node")
                else []}


class Heartbeat(_Record):
    """How the control plane reads nodes/{node}: the fields of respawn.contract.Heartbeat, which the agent writes."""

    job_id: str
    attempt: int
    worker: int = 0  # a multi-host TPU slice's worker (its document: respawn.contract.heartbeat_id); 0 on one host
    zone: str | None = None
    state: NodeState
    step: int | None = None
    committed_step: int | None = None
    total_steps: int | None = None
    exit_code: int | None = None
    output_tail: str | None = None
    failed_command: list[str] | None = None  # state setup-failed: the setup step that failed
    notice: str | None = None  # what told the agent: preempted, maintenance-event, sigterm
    emergency: dict[str, Any] | None = None  # the trainer's emergency-save outcome
    started_at: datetime | None = None
    first_step: int | None = None  # the trainer's first step, and when the agent saw it (respawn.contract.Heartbeat)
    first_step_at: datetime | None = None
    generation: int | None = None  # a multi-node member: the generation its trainer runs (or last ran)
    step_idle_seconds: float | None = None  # since the trainer's step last changed (the stall rule, functions/job.py)
    master_reachable: bool | None = None  # a member other than the master: the master's address answered
    env_cache: dict[str, Any] | None = None  # trainer.cache: {state, key, bytes} (respawn.contract.ENV_CACHE_STATES)
    heartbeat_at: datetime


class JobEvent(_Record):
    at: datetime
    from_state: State | None
    to_state: State
    cause: str
    details: dict[str, Any] = Field(default_factory=dict)
    expire_at: datetime | None = None

    @classmethod
    def new(cls, from_state: State | None, to_state: State, cause: str, **details: Any) -> JobEvent:
        now = datetime.now(timezone.utc)
        return cls(
            at=now, from_state=from_state, to_state=to_state, cause=cause, details=details,
            expire_at=now + EVENT_RETENTION,
        )


class AdviceRecord(_Record):
    """One zone × machine shape's capacity advice as last asked (respawn.advice), reused by every job until `until`;
    `error`: why it could not be had (then the zones keep the order listed)."""

    zone: str
    shape: str  # respawn.advice.Shape.key
    obtainability: float | None = None
    uptime_seconds: float | None = None
    error: str | None = None
    fetched_at: datetime
    until: datetime


class ZoneStats(_Record):
    """What the controller saw of one provisioning model in one zone for one accelerator, across every job (the
    `stats` map of capacity/{zone}~{accelerator}, by model; functions/stats.py; refusals counted where their cooldown is recorded)."""

    refusals: int = 0  # creates and starts refused for capacity or quota
    nodes: int = 0  # nodes obtained (reached RUNNING)
    obtain_seconds: float = 0.0  # their time from the create (or start) to RUNNING, summed
    lives: int = 0  # nodes whose life ended (preempted, lost, replaced, the job over)
    life_seconds: float = 0.0  # their time from running (MemberStatus.running_at) to that end, summed
    preemptions: int = 0  # of those, taken by the platform

    @property
    def mtbi_seconds(self) -> float | None:
        """Mean time between interruptions: node time observed per preemption (None before the first)."""
        return self.life_seconds / self.preemptions if self.preemptions else None

    @property
    def obtain_mean_seconds(self) -> float | None:
        return self.obtain_seconds / self.nodes if self.nodes else None


class CapacityRecord(_Record):
    zone: str
    accelerator_type: str
    reason: Literal["capacity", "quota"]
    code: str
    message: str = ""
    recorded_at: datetime
    until: datetime
    pools: list[str] = Field(default_factory=list)  # the capacity pools it cools (placement.pools_refused); [] = all
