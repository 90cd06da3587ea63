"""Multi-node jobs: member slots, generations, and what the job does when a slot is empty. Pure: no cloud
library, no I/O, no clock.

A job has `spec.slots` member slots (its `nodes` and its `spare_nodes`), numbered 0..slots-1, all in one zone.
Slots 0..on_demand_nodes-1 are standard (on-demand) VMs, the rest take the spec's model (Spot or preemptible). A
slot holds at most one node at a time (besides one still in its notice: decide._on_notice): its replacement is
created only once the old node is gone. Node names stay `{job}-{attempt}` with one attempt counter for the whole
job (every create takes the next number), so a replacement always has a new name and one node is the N = 1 case of
the same naming. A slot is not tied to a rank: a generation takes `nodes` serving slots, and a serving slot that
no generation names is a warm spare (prepared, waiting), which the next generation takes in a lost member's place.

A generation is one membership of the training world: its members (node names in node-rank order), the world
size and the master address. Node rank 0 is the master: an on-demand member when there is one (it is never
preempted), else the member of the lowest slot; a master that still serves stays master, so survivors keep their
ranks where they can. Every trainer runs against exactly one generation (torchrun with static ranks: --nnodes,
--node-rank, --master-addr of that generation); a new generation restarts the survivors' processes, never their
VMs.

What happens when slots are empty (plan()):
- `nodes` slots serve: run the generation of them, the previous members first (a new one when the members changed:
  a replacement or a spare joined);
- an empty slot's replacement is on its way (created or booting): wait for it; the survivors hold;
- the zone refused a replacement: continue with the survivors when they are at least `min_nodes` (a smaller
  generation; the refused slots are retried), else move the whole job to the next zone of its list (members have
  disks of their own, so the trainer commits a step only once every rank's files are in the remote store: the
  newest committed step survives the move, docs/checkpoint.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from respawn.contract import Generation
from respawn.schema import DEFAULT_MODEL, JobSpec, Tier

from . import models


def forms_generations(slots: int) -> bool:
    """Whether a job of `slots` member slots (JobSpec.slots: its nodes and spares) forms generations: a world of
    several nodes meets at a master, and a spare waits until a generation names it; one node alone trains as soon as
    it is prepared, so its slot's decision is the job's."""
    return slots > 1


def slot_provisioning(spec: JobSpec, slot: int) -> str:
    """The provisioning model of slot `slot`: standard for the first on_demand_nodes slots, else the spec's
    model."""
    if not 0 <= slot < spec.slots:
        raise ValueError(f"slot {slot} is outside 0..{spec.slots - 1}")
    if slot < spec.on_demand_nodes:
        return "standard"
    return spec.provisioning


@dataclass(frozen=True)
class Slot:
    """What member slot `index` of a job is, as decide.decide reads it (slot_of): the zones its next node may go to
    and the provisioning tiers it walks, its model being the first one's."""

    index: int
    zones: tuple[str, ...]
    tiers: tuple[Tier, ...]

    @property
    def provisioning(self) -> str:
        return self.tiers[0].model

    def tier(self, model: str | None) -> Tier | None:
        """The slot's tier of model `model` (None: it has none, e.g. a node of an older spec)."""
        return next((t for t in self.tiers if t.model == (model or DEFAULT_MODEL)), None)


def slot_of(spec: JobSpec, index: int, zone: str | None = None) -> Slot:
    """Slot `index` of the job: the job's tiers, or standard alone for an on-demand slot (slot_provisioning); the
    job's zone alone once the slot is to stay in it (`zone`), else the job's zone list."""
    model = slot_provisioning(spec, index)
    tiers = tuple(spec.provisioning_tiers) if model == spec.provisioning else (Tier(model=model),)
    return Slot(index, (zone,) if zone is not None else tuple(spec.zones), tiers)


@dataclass(frozen=True)
class SlotView:
    """What reconcile observed of one slot."""

    slot: int
    node: str | None  # the slot's node while the API shows one; None: the slot is empty (never filled, or gone)
    serving: bool  # the API says it runs and its agent (every worker of a TPU slice) beats
    address: str | None = None  # its internal IP, once the API shows it
    provisioning: str = DEFAULT_MODEL
    refused: bool = False  # the zone refused this slot's replacement in the current round


def form_generation(previous: Generation | None, serving: Sequence[SlotView], size: int | None = None
                    ) -> Generation | None:
    """The generation of at most `size` serving slots (None: all of them): `previous` itself when its members are exactly those chosen,
    a new one (number + 1) otherwise, None when nothing serves or a chosen member has no address yet. The
    previous generation's members that still serve are chosen first (a spare never displaces a survivor), then
    slots of a lasting model (on-demand, a reservation: models.Model.lasting), then the lowest slots."""
    ready = [s for s in serving if s.serving and s.node is not None]
    kept = set(previous.members) if previous is not None else set()
    chosen = sorted(ready, key=lambda s: (s.node not in kept, not models.of(s.provisioning).lasting, s.slot))[:size]
    if not chosen or any(s.address is None for s in chosen):
        return None
    if previous is not None and set(previous.members) == {s.node for s in chosen}:
        return previous
    by_slot = sorted(chosen, key=lambda s: s.slot)
    keep = previous.members[0] if previous is not None else None
    master = next((s for s in by_slot if s.node == keep), None)
    if master is None:
        master = next((s for s in by_slot if models.of(s.provisioning).lasting), by_slot[0])
    ordered = [master] + [s for s in by_slot if s is not master]
    return Generation((previous.number if previous else 0) + 1, tuple(s.node for s in ordered), master.address)


class Step(str, enum.Enum):
    RUN = "run"  # train in `generation` (every slot, or the survivors of an elastic job)
    WAIT = "wait"  # a replacement is on its way; the survivors hold (generation: the last one, unchanged)
    MOVE = "move"  # fewer than min_nodes and the zone refused: the whole job goes to the next zone


@dataclass(frozen=True)
class Plan:
    step: Step
    generation: Generation | None
    reason: str = ""


def plan(spec: JobSpec, slots: Sequence[SlotView], previous: Generation | None) -> Plan:
    """What a multi-node job does with the slots as observed (which empty slot gets a node is job.decide's)."""
    if sorted(s.slot for s in slots) != list(range(spec.slots)):
        raise ValueError(f"expected one view per slot 0..{spec.slots - 1}, got slots {sorted(s.slot for s in slots)}")
    serving = [s for s in slots if s.serving]
    empty = [s for s in slots if not s.serving]
    if len(serving) >= spec.nodes:
        generation = form_generation(previous, serving, spec.nodes)
        if generation is None:
            return Plan(Step.WAIT, previous, "a member's address is not known yet")
        return Plan(Step.RUN, generation, "every slot serves" if not empty else f"{spec.nodes} nodes serve")
    refused = [s for s in empty if s.refused]
    on_the_way = [s for s in empty if not s.refused]  # booting, or to be created now
    if not refused:
        return Plan(Step.WAIT, previous, f"waiting for slot(s) {', '.join(str(s.slot) for s in empty)} to serve")
    if len(serving) >= spec.min_nodes:
        generation = form_generation(previous, serving, spec.nodes)
        if generation is None:
            return Plan(Step.WAIT, previous, "a survivor's address is not known yet")
        return Plan(Step.RUN, generation,
                    f"the zone refused slot(s) {', '.join(str(s.slot) for s in refused)}: continuing on "
                    f"{len(serving)} of {spec.nodes} nodes (min_nodes {spec.min_nodes}) and retrying")
    if len(serving) + len(on_the_way) >= spec.min_nodes:
        return Plan(Step.WAIT, previous,
                    f"the zone refused slot(s) {', '.join(str(s.slot) for s in refused)}; waiting for slot(s) "
                    f"{', '.join(str(s.slot) for s in on_the_way)} to reach min_nodes {spec.min_nodes}")
    return Plan(Step.MOVE, None,
                f"{len(serving)} of {spec.nodes} nodes serve, fewer than min_nodes {spec.min_nodes}, and the zone "
                f"refused slot(s) {', '.join(str(s.slot) for s in refused)}: moving the job to the next zone")
