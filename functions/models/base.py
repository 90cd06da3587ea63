"""The provisioning models' base and registry (the package's docstring says what a model is): `Model`, the interface
the decision core asks, with an on-demand VM's defaults; `Obtaining`, how a node is obtained; the registries both
are looked up in. Each model's module (and queued.py) imports this and registers itself; the package's __init__
imports them all, so that importing the package registers every model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from respawn.contract import NOTICE_RUN_ENDING
from respawn.schema import DEFAULT_MODEL, Heartbeat, JobSpec, MemberStatus, Tier

# A planned stop: the node's model ended it as it said it would (a flex-start run's end, a calendar reservation's).
# The next node is made as after a loss, but it counts as neither a preemption nor a failure, and its zone is not
# avoided.
RUN_ENDED = "run_ended"
# A loss within this long of a run's known end (its agent's notice aside) is that end: the deletion comes at the end
# as the platform counts it, which the control plane knows to a poll or so.
RUN_END_SLACK = timedelta(minutes=10)
# Losses of the job's own doing, which the run's end does not explain unless the agent said the end had come.
_OWN = ("trainer_crashed", "no_heartbeat")


@dataclass(frozen=True)
class ComputeFields:
    """A Compute Engine instance's fields a model sets, as plain values in compute_v1's field names (the adapter
    builds the messages): `scheduling` (compute_v1.Scheduling), `extra` (other Instance fields: params,
    reservation_affinity), `run_seconds` (a run that ends on its own: its length, for the node's metadata),
    `run_ends_at` (a run that ends at a known time, for the node's metadata)."""

    scheduling: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    run_seconds: int | None = None
    run_ends_at: datetime | None = None  # a run that ends at a known time (a calendar reservation's end)


class Model:
    """One provisioning model. The defaults are an on-demand VM's: override what differs."""

    name: str = ""  # as the spec writes it
    label: str = ""  # in messages
    strategy_name: str = ""  # how it reads in a recovery strategy's name
    capacity_pool: str = ""  # whose spare capacity it draws on: a refusal cools this pool down
    quota_pool: str = "standard"  # which quota it is charged to: a quota refusal cools every pool on it
    price_key: str = "standard"  # the respawn.prices model it is billed as (prices.TIER's keys)
    tpu: bool = True  # a Cloud TPU node may be obtained so
    queued: bool = True  # ...and through a queued resource (its tier there: queued_tier)
    # Phrases of a create's refusal that say this model's capacity is used up (placement.classify reads them).
    capacity_phrases: tuple[str, ...] = ()
    # Neither taken by the platform nor ended by its own run: a generation's preferred member and master.
    lasting: bool = False
    restarts_in_place: bool = False  # a node its preemption STOPs may be started again where it stands
    advised: bool = False  # capacity advice scores nodes of this model (placement.rank: advice)
    unanswered_cause: str = "node_gone"  # the event cause of unanswered()'s refusal
    # Its insert stays open while the request waits for capacity: the create returns once the VM is PENDING, and the
    # wait is observed on the next passes, as a queued resource's is (adapters/compute.py).
    insert_waits_for_capacity: bool = False

    def compute(self, spec: JobSpec, tier: Tier | None) -> ComputeFields:
        """The instance's scheduling (and other fields) for a node of this model. Restarts stay with the control
        plane (automatic_restart off) so that one place decides what a lost node means; GPUs cannot live-migrate."""
        return ComputeFields({"provisioning_model": "STANDARD", "on_host_maintenance": "TERMINATE",
                              "automatic_restart": False})

    def tpu_scheduling(self) -> dict[str, bool]:
        """A Cloud TPU node's schedulingConfig, created directly."""
        return {}

    def queued_tier(self) -> str | None:
        """The queued resource's tier field for this model: "spot", or None for on demand (no tier, as Google's own
        on-demand sample sends; issue #36 D6)."""
        raise ValueError(f"a queued resource's tiers are spot and guaranteed, not {self.name}")

    def zones(self, tier: Tier, zones: list[str]) -> list[str]:
        """The zones a node of this model may go to, of the job's."""
        return list(zones)

    def loss_cause(self, cause: str, s: MemberStatus, hb: Heartbeat | None, now: datetime) -> str:
        """What a loss of the slot's node was, given what was observed (`cause`): a run with a known end (its
        status's run_ends_at, which on_running set) ended as planned, whatever was observed of it (a deleted VM, a
        stale heartbeat after the agent's final one, a notice), unless the loss is the job's own and the agent did
        not say the end had come; otherwise `cause` as it is."""
        said = hb is not None and hb.notice == NOTICE_RUN_ENDING
        if said or (cause not in _OWN and self.run_end_near(s, hb, now)):
            return RUN_ENDED
        return cause

    def on_running(self, tier: Tier | None, now: datetime) -> dict[str, Any]:
        """The slot's status fields to set when its node is first seen serving."""
        return {}

    def unanswered(self, s: MemberStatus, tier: Tier | None) -> str | None:
        """The node is gone before it ever ran: why, when that is this model's refusal of the zone (a request
        whose wait for capacity ran out); None: a loss like any other."""
        return None

    def run_end_near(self, s: MemberStatus, hb: Heartbeat | None, now: datetime) -> bool:
        """The node is at the planned end of its run: its agent said the end came (a notice it knows in advance), or
        the end its status knows (run_ends_at) is within RUN_END_SLACK. Never, for a node whose run has no end."""
        if hb is not None and hb.notice == NOTICE_RUN_ENDING:
            return True
        return s.run_ends_at is not None and now >= s.run_ends_at - RUN_END_SLACK


_REGISTRY: dict[str, Model] = {}


def register(model: Model) -> Model:
    if model.name in _REGISTRY:
        raise ValueError(f"provisioning model {model.name} is registered twice")
    _REGISTRY[model.name] = model
    return model


def of(name: str | None) -> Model:
    """The model registered under `name` (None: a node recorded before models were: Spot)."""
    try:
        return _REGISTRY[name or DEFAULT_MODEL]
    except KeyError:
        raise ValueError(f"{name} is not a provisioning model: one of {', '.join(_REGISTRY)}") from None


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def all_models() -> Iterable[Model]:
    return _REGISTRY.values()


def tier_of(spec: JobSpec | None, name: str | None) -> Tier | None:
    """The job's tier of model `name` (None: the job has none, e.g. a node of an older spec)."""
    if spec is None:
        return None
    return next((t for t in spec.provisioning_tiers if t.model == (name or DEFAULT_MODEL)), None)


def capacity_phrases() -> tuple[str, ...]:
    return tuple(p for m in _REGISTRY.values() for p in m.capacity_phrases)


class Obtaining:
    """How a node is obtained: created directly (this class), or through a request that waits for capacity and
    reports its own states until its node is made (a Cloud TPU queued resource: models/queued.py). A request's
    state reaches decide.py as NodeProvider.get reports it (`raw`), marked so that no node state is taken for it."""

    refused_cause = "zone_refused"  # the event cause when the zone did not serve the request

    def used_by(self, spec: JobSpec | None) -> bool:
        return False

    def request_state(self, raw: str | None) -> str | None:
        """The request's state in a reported state; None: a node's state (or nothing)."""
        return None

    def phase(self, raw: str | None) -> str | None:
        """The observation.Phase name of a request's state; None: not a request's."""
        return None

    def refusal(self, spec: JobSpec, s: MemberStatus, raw: str | None, now: datetime) -> str | None:
        """Why the zone did not serve the slot's request (its status message); None while it may still."""
        return None

    def lost_cause(self, raw: str | None) -> str | None:
        """The cause of a loss a request's state shows (its node taken, the request failed); None: not a request's."""
        return None

    def on_running(self, now: datetime) -> dict[str, Any]:
        """The slot's status fields to set when the node is first seen serving."""
        return {}


DIRECT = Obtaining()
_WAYS: list[Obtaining] = []


def register_way(way: Obtaining) -> Obtaining:
    _WAYS.append(way)
    return way


def obtaining(spec: JobSpec | None) -> Obtaining:
    """How the job's nodes are obtained."""
    return next((w for w in _WAYS if w.used_by(spec)), DIRECT)


def request_way(raw: str | None) -> Obtaining:
    """The way whose request a reported state is (DIRECT: a node's state)."""
    return next((w for w in _WAYS if w.request_state(raw) is not None), DIRECT)
