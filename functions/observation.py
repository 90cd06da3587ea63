"""What reconcile observed of one member slot, as the decision core reads it (pure): a node's state normalised over
Compute Engine and Cloud TPU (`Phase`, `phase_of`, `NodeObs`), the causes an event or an agent's notice gives
(`Hint`, `NOTICE`), the recovery settings, the `Observation` itself, and the helpers that read one and nothing more:
what observe() must read for the decision (`needs_capacity`, `needs_console`), the heartbeat of the slot's current
life (`current_heartbeat`) and of a multi-host slice (`slice_heartbeat`). functions/decide.py decides on it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from respawn.advice import ZoneAdvice
from respawn.images import ImageCheck
from respawn.prices import Quote
from respawn.schema import Heartbeat, JobSpec, JobStatus, MemberStatus, NodeState, SlotStatus, State

from . import membership, models, recovery


class Phase(str, enum.Enum):
    """A node's real state, normalised over Compute Engine instance statuses and Cloud TPU node states."""

    ABSENT = "ABSENT"  # the API says 404
    BOOTING = "BOOTING"  # PENDING, PROVISIONING, STAGING, CREATING, STARTING, RESTARTING, REIMAGING, REPAIRING
    RUNNING = "RUNNING"  # RUNNING, READY
    STOPPING = "STOPPING"  # PENDING_STOP, STOPPING, SUSPENDING, DEPROVISIONING: on its way to a dead state
    DELETING = "DELETING"
    DEAD = "DEAD"  # TERMINATED, STOPPED, SUSPENDED, PREEMPTED, HIDDEN...: not serving, must be deleted (or started)
    UNKNOWN = "UNKNOWN"


# Every compute_v1.Instance.Status value but UNDEFINED_STATUS (gcp-facts §3). PENDING: a VM waits for capacity
# before it provisions (a request of a model that waits: models/). PENDING_STOP: the guest is shutting down gracefully, before STOPPING.
# DEPROVISIONING: the VM is halted and its resources are being torn down.
GCE_PHASES = {
    "PENDING": Phase.BOOTING, "PROVISIONING": Phase.BOOTING, "STAGING": Phase.BOOTING, "RUNNING": Phase.RUNNING,
    "PENDING_STOP": Phase.STOPPING, "STOPPING": Phase.STOPPING, "SUSPENDING": Phase.STOPPING,
    "DEPROVISIONING": Phase.STOPPING, "STOPPED": Phase.DEAD, "SUSPENDED": Phase.DEAD, "TERMINATED": Phase.DEAD,
    "REPAIRING": Phase.BOOTING,
}
TPU_PHASES = {
    "CREATING": Phase.BOOTING, "READY": Phase.RUNNING, "RESTARTING": Phase.BOOTING, "REIMAGING": Phase.BOOTING,
    "DELETING": Phase.DELETING, "REPAIRING": Phase.BOOTING, "STOPPED": Phase.DEAD, "STOPPING": Phase.STOPPING,
    "STARTING": Phase.BOOTING, "PREEMPTED": Phase.DEAD, "TERMINATED": Phase.DEAD, "HIDING": Phase.DEAD,
    "HIDDEN": Phase.DEAD, "UNHIDING": Phase.BOOTING, "UNKNOWN": Phase.UNKNOWN, "STATE_UNSPECIFIED": Phase.UNKNOWN,
}


def phase_of(kind: str, raw_state: str | None) -> Phase:
    """kind gpu|tpu, the API's state string (None: 404; a request's, while the node is obtained through one:
    models.Obtaining) → Phase."""
    if raw_state is None:
        return Phase.ABSENT
    request = models.request_way(raw_state).phase(raw_state)
    if request is not None:
        return Phase(request)
    table = TPU_PHASES if kind == "tpu" else GCE_PHASES
    return table.get(raw_state.upper(), Phase.UNKNOWN)


@dataclass(frozen=True)
class NodeObs:
    phase: Phase
    raw_state: str | None = None

    @property
    def present(self) -> bool:
        return self.phase is not Phase.ABSENT


ABSENT = NodeObs(Phase.ABSENT)


# The cause of a hint from a node agent's notice message (contract.notice_nudge): the node is about to go. A notice
# of its run's end (kind NOTICE_RUN_ENDING: a model whose runs end as planned) is its own cause: a planned stop,
# whatever the heartbeat says yet (the message may come before the agent's `preempting` beat).
NOTICE = "notice"
RUN_END_NOTICE = "notice:run-ending"
NOTICES = (NOTICE, RUN_END_NOTICE)


@dataclass(frozen=True)
class Hint:
    """What an event said about one node: `cause` (e.g. "preempted") for node `node`, at `at` (the entry's time)."""

    cause: str
    node: str
    at: datetime | None = None

    def about(self, node: str | None, started_at: datetime | None) -> str | None:
        """The cause, when the event is about `node`'s current life (not an older life that a restart replaced)."""
        if node != self.node or (self.at is not None and started_at is not None and self.at < started_at):
            return None
        return self.cause


@dataclass(frozen=True)
class Settings:
    stale_heartbeat_seconds: float = 120  # agents beat every 15 s
    boot_grace_seconds: float = 900  # first heartbeat may take this long after create (image boot, agent install)
    backoff_base_seconds: float = 30
    max_in_place_restarts: int = 1  # per node; then the node is replaced (a new name, maybe a new zone)
    # A multi-node generation whose step has not changed for this long while every member trains in it and beats is
    # stalled (a partition: job.stalled); 0 turns the rule off. Far above a beat (15 s) and a usual pause
    # between two steps (a checkpoint save, a trainer's start and restore), and below the trainers' collective
    # timeout (RESPAWN_COLLECTIVE_TIMEOUT_SECONDS, 300 s), so a cut-off member is replaced before the survivors'
    # collectives fail and restart the world with it. Raise both for longer pauses.
    progress_timeout_seconds: float = 240
    # A job with a budget stops when its cost would reach the cap within this long at its current burn: the sweep's
    # period (2 min) and a node's soft-off (30 s), so no node runs past the cap before the next look.
    budget_lookahead_seconds: float = 150
    timings: recovery.Timings = recovery.Timings()  # a fresh node against a restart in place, during a notice


@dataclass(frozen=True)
class Observation:
    job_id: str
    spec: JobSpec | None  # the user's, as the job document holds it
    spec_errors: tuple[str, ...]
    status: SlotStatus | JobStatus  # a member slot's (decide), the job's (functions/job.py)
    cancel_requested: bool
    node: NodeObs  # the API's view of status.node in status.zone
    heartbeat: Heartbeat | None  # nodes/{status.node}
    now: datetime
    hint: str | None = None  # the cause an event gave for the current node's current life (Hint.about)
    blocked: Mapping[str, datetime] = field(default_factory=dict)  # zone → cooldown end, for this accelerator
    # zone → capacity advice, read only for a job that asks (placement.rank: advice) when it may place a node
    advice: Mapping[str, ZoneAdvice] = field(default_factory=dict)
    settings: Settings = Settings()
    image: ImageCheck | None = None  # the boot image as checked on the job's first handling (GPU); None: not checked
    # A slot's next node takes the job-wide attempt counter's next number (functions/job.py passes it; every node
    # of a job has its own name). None: the slot's attempt + 1.
    next_attempt: int | None = None
    # node name → the end of its serial console, read only for a node that needs_console() says decide may declare
    # a boot failure of (None: the provider has no console for it, e.g. a Cloud TPU VM).
    consoles: Mapping[str, str | None] = field(default_factory=dict)
    # The job's node prices by provisioning model (functions/costs.py), read only when a life may open
    # (costs.needs_quote); None: not read.
    quote: Quote | None = None
    # The share of its budget the job has spent (functions/job.py, from its ledger); None without a budget. A tier
    # with while_budget_below is passed over past it (recovery.Strategy.tier).
    budget_used: float | None = None
    # The API's view of status.leaving (the node the slot replaced during its notice); None: not looked at.
    leaving: NodeObs | None = None
    # status.leaving's heartbeat (its final one tells how its emergency save ended); None: none, or not looked at.
    leaving_heartbeat: Heartbeat | None = None
    # The member slot decided: its zones and tiers (functions/job.py: membership.slot_of). None: a one-node job's
    # one slot, walking the job's zones.
    slot: membership.Slot | None = None


def needs_capacity(status: MemberStatus, node: NodeObs, hint: str | None = None) -> bool:
    """Whether decide() may consult the zone cooldowns (Observation.blocked) for a job in `status` whose node is
    `node` (`hint`: what an event said of it): only when it may place a node or weigh a restart in place. observe()
    skips those reads otherwise."""
    return (status.state in (State.PENDING, State.WAITING_FOR_CAPACITY, State.PREEMPTED, State.RESTARTING)
            or node.phase in (Phase.ABSENT, Phase.DEAD, Phase.STOPPING, Phase.DELETING) or hint in NOTICES)


def needs_console(status: MemberStatus, node: NodeObs, heartbeat: Heartbeat | None, settings: Settings,
                  now: datetime) -> bool:
    """Whether decide() may declare the current node a boot failure (it serves, past its boot grace, and its agent
    never reported), and so read its console (Observation.consoles): observe() reads it only then."""
    return (status.state is State.RUNNING and node.phase is Phase.RUNNING
            and current_heartbeat(heartbeat, status) is None
            and (age_of(now, status.node_started_at) or 0) > settings.boot_grace_seconds)


def age_of(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else (now - then).total_seconds()


def current_heartbeat(hb: Heartbeat | None, s: MemberStatus) -> Heartbeat | None:
    """`hb` when it is of the slot's current node's current life: same attempt, not older than the node's
    (re)start; else None."""
    if hb is None or hb.attempt != s.attempt:
        return None
    if s.node_started_at is not None and hb.heartbeat_at < s.node_started_at:
        return None
    return hb


def slice_heartbeat(workers: Sequence[Heartbeat | None]) -> Heartbeat | None:
    """One heartbeat for a node from its workers' (a multi-host TPU slice: one per worker VM, worker 0 first; a
    single host: one). The slice serves only while every worker beats, so a worker without a heartbeat makes the
    slice's None (decide: still booting, or after the boot grace no heartbeat) and the stalest worker's time is
    the slice's. A worker whose setup failed, or whose trainer crashed, speaks for the slice; the slice exited 0
    only when every worker did. Otherwise the first worker still working is the base, with the newest committed
    step, any worker's notice, and its first step once every worker reporting steps stepped."""
    if not workers or any(hb is None for hb in workers):
        return None
    hbs: list[Heartbeat] = list(workers)  # type: ignore[arg-type]
    if len(hbs) == 1:
        return hbs[0]
    for hb in hbs:
        if hb.state is NodeState.SETUP_FAILED and not noticed(hb):
            return hb
    for hb in hbs:
        if hb.state is NodeState.EXITED and hb.exit_code not in (None, 0) and not noticed(hb):
            return hb
    # The slice steps once every worker that reports steps has (a worker sharing its host's status file reports
    # none): its last such worker's first step (recovery_time), also when every worker has finished.
    reporting = [hb for hb in hbs if hb.step is not None]
    stepped = bool(reporting) and all(hb.first_step_at is not None and hb.first_step is not None for hb in reporting)
    first = {"first_step": min(hb.first_step for hb in reporting) if stepped else None,  # type: ignore[type-var]
             "first_step_at": max(hb.first_step_at for hb in reporting) if stepped else None}  # type: ignore[type-var]
    if all(hb.state is NodeState.EXITED and hb.exit_code == 0 for hb in hbs):
        return hbs[0].model_copy(update=first)
    base = next((hb for hb in hbs if hb.state is not NodeState.EXITED), hbs[0])
    committed = [hb.committed_step for hb in hbs if hb.committed_step is not None]
    seen = next((hb for hb in hbs if noticed(hb)), None)
    return base.model_copy(update={
        **first,
        "heartbeat_at": min(hb.heartbeat_at for hb in hbs),
        "committed_step": max(committed) if committed else None,
        "notice": seen.notice if seen is not None else base.notice,
        "state": NodeState.PREEMPTING if seen is not None and seen.state is NodeState.PREEMPTING else base.state,
        "emergency": _worst_save(hbs, base),
    })


# A slice's emergency save is committed only when every worker's is: the worst worker's outcome speaks for it.
_SAVE_WORST_FIRST = ("failed", "abandoned", "not-started", "saving")


def _worst_save(hbs: Sequence[Heartbeat], base: Heartbeat) -> dict[str, Any] | None:
    saves = [hb.emergency for hb in hbs if isinstance(hb.emergency, dict)]
    return next((e for state in _SAVE_WORST_FIRST for e in saves if e.get("state") == state), base.emergency)


def noticed(hb: Heartbeat) -> bool:
    """The agent saw a preemption/maintenance notice: an exit now is the preemption, not a crash."""
    return hb.notice is not None or hb.state is NodeState.PREEMPTING
