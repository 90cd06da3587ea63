"""Demo scenarios: what `respawn demo --scenario FILE` runs, validated strictly (a typo is an error).

A scenario names the zones and their capacity timelines, the job (its spec, valid or deliberately invalid), the
trainer, what to inject (preemptions, host errors, faults) and the state the job must end in. Instead of the demo's
example job and trainer, it may name a job spec file of the user's own (`job_file`, or `respawn demo --job`), whose
own trainer then runs (sim/demo/jobfile.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from respawn.app.cli import yaml_problem
from respawn.schema import State, error_lines
from sim.tpu import ENDPOINT_FORMATS, ENDPOINTS_HOSTNAMES

DEFAULT_ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A job spec's provisioning model → the sim's (its capacity timelines are per model).
SIM_MODELS = {"spot": "SPOT", "flex-start": "FLEX_START", "standard": "STANDARD", "reservation": "RESERVATION"}


class CapacityChange(_Strict):
    """From this moment on, the zone holds `count` more nodes of the job's accelerator (null: unlimited), of one
    provisioning model (`model`) or of all."""

    at_seconds: float | None = Field(default=None, ge=0, description="seconds after the job is registered")
    after_preemption: int | None = Field(default=None, ge=1, description="right after the Nth injected preemption")
    delay_seconds: float = Field(default=0, ge=0, description="with after_preemption: this long after it")
    count: int | None = Field(default=None, ge=0)
    model: Literal["spot", "flex-start", "standard", "reservation"] | None = Field(
        default=None, description="only this provisioning model's capacity (Spot dry while flex-start is not; "
        "reservation: the size of the zone's specific reservation); default every model's")

    @property
    def sim_model(self) -> str | None:
        return SIM_MODELS[self.model] if self.model else None

    @model_validator(mode="after")
    def _one_trigger(self) -> CapacityChange:
        if (self.at_seconds is None) == (self.after_preemption is None):
            raise ValueError("give exactly one of at_seconds or after_preemption")
        if self.delay_seconds and self.after_preemption is None:
            raise ValueError("delay_seconds applies only with after_preemption")
        return self


class ZoneAdvice(_Strict):
    """What the sim's capacity advice scores Spot VMs of the job's machine type in the zone (sim/advice.py)."""

    obtainability: float = Field(ge=0, le=1)
    estimated_uptime_seconds: float | None = Field(default=None, gt=0)


class Zone(_Strict):
    name: str
    capacity: list[CapacityChange] = Field(default_factory=list, description="unlimited unless changed")
    advice: ZoneAdvice | None = Field(default=None, description="capacity advice (a job with placement.rank: "
                                      "advice); default: what the zone's capacity says")


class Preemption(_Strict):
    """Preempt (or host-error) the node running the job at a training step or a time: once every member of the
    current generation trains and the last recovery has been told (`when: training`), or once the slot holds a node
    not hit before whose agent beats (`when: joined`: a replacement hit as it joins, before or while it trains)."""

    at_step: int | None = Field(default=None, ge=1)
    at_seconds: float | None = Field(default=None, ge=0)
    kind: Literal["preempted", "host_error"] = "preempted"
    slot: int | None = Field(default=None, ge=0, description="a job of several nodes: the member slot whose node is "
                             "hit (default: the job's node, the generation's master)")
    slots: list[int] = Field(default_factory=list, description="several member slots hit at the same moment")
    when: Literal["training", "joined"] = "training"

    @model_validator(mode="after")
    def _one_trigger(self) -> Preemption:
        if (self.at_step is None) == (self.at_seconds is None):
            raise ValueError("give exactly one of at_step or at_seconds")
        if self.slot is not None and self.slots:
            raise ValueError("give slot (one member) or slots (several), not both")
        if len(set(self.slots)) != len(self.slots) or any(i < 0 for i in self.slots):
            raise ValueError(f"slots {self.slots}: each member slot once, numbered from 0")
        if self.when == "joined" and len(self.targets()) != 1:
            raise ValueError("when: joined hits one member slot's replacement: give slot")
        return self

    def targets(self) -> list[int]:
        """The member slots hit ([] for a one-node job's node)."""
        return list(self.slots) if self.slots else ([self.slot] if self.slot is not None else [])


class SlackFault(_Strict):
    status: Literal[429, 500, 503] = 500
    count: int = Field(default=3, ge=1, description="how many posts fail before Slack recovers")


class Partition(_Strict):
    """A job of several nodes: once every member of the generation trains at `at_step`, cut the member of `slot` off
    from its peers (the sim's partition: it keeps running and beating, its collectives hang); heal it after
    `heal_after_seconds` (never if unset)."""

    slot: int = Field(ge=0)
    at_step: int = Field(ge=1)
    heal_after_seconds: float | None = Field(default=None, ge=0)


class Faults(_Strict):
    partition: Partition | None = None
    duplicate_events: int = Field(default=0, ge=0, le=10, description="each audit event delivered N extra times")
    drop_events: int = Field(default=0, ge=0, description="drop the first N audit events the sink routes")
    slack: SlackFault | None = None
    api_error_rate: float = Field(default=0.0, ge=0, le=0.9, description="share of create calls answered 503")


class TrainerSettings(_Strict):
    framework: Literal["torch", "jax"] = "torch"
    ranks: int = Field(default=1, ge=1, le=16, description="DDP processes under torchrun on the node (torch)")
    steps: int = Field(default=300, ge=10)
    state_mb: float = Field(default=2, gt=0, le=4096)
    checkpoint_every: int = Field(default=50, ge=1)
    step_seconds: float = Field(default=0.05, ge=0, le=5)
    seed: int = 0
    image: bool = Field(default=False, description="run in the demo's trainer image (sim/trainer_image.py: "
                        "Debian's Python with torch, this trainer in /opt/trainer), pushed to a local registry and "
                        "pulled by each node's podman (needs root, podman and runc, docker-registry)")
    shell: bool = Field(default=False, description="with image: the command is `sh -c '…'` without exec, so the "
                        "container's first process is the shell, not the trainer")

    @model_validator(mode="after")
    def _ranks_need_torch(self) -> TrainerSettings:
        if self.image and self.framework != "torch":
            raise ValueError("the demo's trainer image holds torch, not JAX: set framework: torch")
        if self.shell and not self.image:
            raise ValueError("shell applies to the trainer image's command: set image: true")
        if self.ranks > 1 and self.framework != "torch":
            raise ValueError("ranks above 1 run torch DDP under torchrun: set framework: torch")
        if 64 % self.ranks:  # the example's global batch is split evenly among the ranks
            raise ValueError("ranks must divide the example's global batch of 64 (1, 2, 4, 8 or 16)")
        return self


class Expect(_Strict):
    state: State = State.SUCCEEDED
    lost_steps: int | None = Field(default=None, ge=0, description="if set, lost steps must equal this")
    provisioning: list[Literal["spot", "flex-start", "standard", "reservation"]] | None = Field(
        default=None, description="if set, the provisioning model of each node that ran, in the order they started")


class Scenario(_Strict):
    name: str
    description: str = ""
    zones: list[Zone] = Field(default_factory=lambda: [Zone(name=z) for z in DEFAULT_ZONES], min_length=1,
                              description="each a mapping (name, capacity, advice) or its name alone")
    accelerator: Literal["gpu", "tpu"] = "gpu"
    # The hostname format by default: the one JAX's reader calls new (gcp-facts §13); triples, the older one, remain.
    tpu_endpoints: Literal[ENDPOINT_FORMATS] = Field(  # type: ignore[valid-type]
        default=ENDPOINTS_HOSTNAMES, description="the format of a TPU worker's worker-network-endpoints: the workers' "
        "hostnames or name:uid:IP triples")
    job_file: str | None = Field(default=None, description="a job spec file (YAML or JSON, relative to this scenario "
                                 "file) whose own trainer runs instead of the demo's example: its trainer.workdir "
                                 "directory, setup and command; default zones: the job's")
    job: dict[str, Any] = Field(default_factory=dict, description="job spec fields laid over the demo's default spec "
                                "(or over job_file's)")
    trainer: TrainerSettings = Field(default_factory=TrainerSettings, description="the demo's example trainer (not "
                                     "with job_file: the job's own command runs)")
    preemptions: list[Preemption] = Field(default_factory=list)
    faults: Faults = Field(default_factory=Faults)
    notice_seconds: float = Field(default=6, gt=0, le=120, description="the sim's notice window (30 s on GCE)")
    notice_budget_seconds: float = Field(default=4, gt=0, description="the trainer's emergency-save budget")
    sweep_seconds: float = Field(default=5, gt=0, description="Cloud Scheduler period")
    stale_after_seconds: float = Field(default=10, gt=0, description="heartbeat age the sweep calls stale")
    heartbeat_seconds: float = Field(default=1, gt=0)
    progress_timeout_seconds: float = Field(default=0, ge=0, description="the stall rule's progress timeout "
                                            "(RESPAWN_PROGRESS_TIMEOUT_SECONDS); 0: off, as a demo's pauses are short")
    timeout_seconds: float = Field(default=240, gt=0, description="give up on the job after this long")
    run_duration_scale: float = Field(default=1.0, gt=0, le=1, description="wall seconds per second of a flex-start "
                                      "VM's run duration and request wait (the sim's run_duration_scale)")
    expect: Expect = Field(default_factory=Expect)

    @field_validator("zones", mode="before")
    @classmethod
    def _zone_names(cls, zones: Any) -> Any:
        """A zone written as its name alone (the job spec's form, `zones: [us-central1-a]`) has unlimited capacity."""
        return [{"name": z} if isinstance(z, str) else z for z in zones] if isinstance(zones, list) else zones

    @model_validator(mode="after")
    def _budget_fits_notice(self) -> Scenario:
        if self.notice_budget_seconds >= self.notice_seconds:
            raise ValueError("notice_budget_seconds must be shorter than notice_seconds, to leave time to exit")
        if self.job_file is not None:  # the job file's own fields decide the rest: checked by with_job_file
            if self.model_fields_set & {"trainer", "accelerator"}:
                raise ValueError("trainer and accelerator describe the demo's example job: with job_file the job's "
                                 "own command and accelerator run; remove them")
            return self
        nodes = self.job.get("nodes", 1)
        if nodes != 1 and self.trainer.framework != "torch":
            raise ValueError("a job of several nodes runs torch DDP under torchrun: set trainer.framework: torch")
        self.check_job_fits(nodes, self.accelerator)
        return self

    def check_job_fits(self, nodes: Any, accelerator: str) -> None:
        """What the injections and faults need of the job: member slots below its node count, a TPU for
        tpu_endpoints. Raises ValueError."""
        if "tpu_endpoints" in self.model_fields_set and accelerator != "tpu":
            raise ValueError("tpu_endpoints is the format of a TPU worker's metadata: it needs a TPU job")
        if any(not (isinstance(nodes, int) and i < nodes) for p in self.preemptions for i in p.targets()):
            raise ValueError(f"a preemption's slots must be below job.nodes ({nodes})")
        part = self.faults.partition
        if part is not None and not (isinstance(nodes, int) and nodes > 1 and part.slot < nodes):
            raise ValueError(f"a partition cuts a member off from its peers: it needs job.nodes above 1 and its slot "
                             f"below job.nodes ({nodes})")
        if part is not None and not self.progress_timeout_seconds:
            raise ValueError("a partition is noticed by the stall rule: set progress_timeout_seconds")


class ScenarioError(ValueError):
    def __init__(self, source: str, errors: list[str]):
        self.errors = errors
        super().__init__(f"{source}: invalid scenario:\n" + "\n".join(f"  - {e}" for e in errors))


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(source, [f"(scenario): expected a mapping of fields, got {type(data).__name__}"])
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(source, error_lines(exc)) from None


def load_scenario(path: Path) -> Scenario:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(str(path), [f"not UTF-8 text (byte {exc.start})"]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(str(path), [f"not valid YAML: {yaml_problem(exc, path)}"]) from None
    sc = parse_scenario(data, str(path))
    if sc.job_file is not None:  # relative to the scenario file, as a job file's workdir is to the job file
        sc = sc.model_copy(update={"job_file": str((path.parent / sc.job_file).resolve())})
    return sc


def default_scenario() -> Scenario:
    """A PyTorch job over three zones, preempted twice; the first zone stocks out after the first preemption."""
    return parse_scenario(
        {
            "name": "default",
            "description": "PyTorch over three zones, two preemptions; the first zone stocks out after the first",
            "zones": [
                {"name": "us-central1-a", "capacity": [{"after_preemption": 1, "count": 0}]},
                {"name": "us-central1-b"},
                {"name": "us-central1-c"},
            ],
            "preemptions": [{"at_step": 80}, {"at_step": 200}],
        },
        "default scenario",
    )
