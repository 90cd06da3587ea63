"""Recovery strategies: where a job's next node goes, and on what terms. Pure. Chosen in one place (strategy_for),
a strategy answers every placement question decide.py asks, so a new way of getting capacity is a new strategy,
not a branch in decide.py: may the lost node be started again in place (`in_place`), which provisioning model the
next node asks for (`tier`: the spec's provisioning tiers, in order, each with when to move on), which zone
(`choose`, by the strategy's zone order: docs/job-spec.md, placement.strategy). Every order skips the zones cooling
down (every job's refusals) and those that refused the job in the current round.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Sequence

from respawn.advice import ZoneAdvice
from respawn.schema import DEFAULT_MODEL, JobSpec, SlotStatus, Tier, ZoneOrder

from . import models, placement
from .placement import cooldowns


# A run that ended as its model planned (models.RUN_ENDED): a planned stop
# (losses.loss_kind), which says nothing against its zone.
RUN_ENDED = models.RUN_ENDED


@dataclass(frozen=True)
class Timings:
    """How long a node takes to serve again, for weighing a fresh node against a restart in place during a notice.
    Defaults from docs/plan.md's sources: a GPU VM's create → trainer running ~90 s (boot, agent, setup from the
    environment cache); a stopped Spot VM's start → trainer running ~60 s (same disk: workdir, environment and local
    checkpoint are there, setup is skipped)."""

    fresh_node_seconds: float = 90.0
    in_place_start_seconds: float = 60.0


def fresh_beats_in_place(window_seconds: float, t: Timings) -> bool:
    """Whether a fresh node created now, during the notice, serves before the noticed node could be restarted in
    place: that one must first stop (the rest of the notice window) and then start."""
    return t.fresh_node_seconds < window_seconds + t.in_place_start_seconds


@dataclass(frozen=True)
class Choice:
    zone: str | None  # None: every zone refused: wait
    provisioning: str
    skipped: tuple[str, ...] = ()
    why: str = ""  # why this model: the tiers moved past (Strategy.tier)
    ranked: tuple[str, ...] = ()  # the zones in the order capacity advice put them, when it changed the list's


@dataclass(frozen=True)
class Strategy:
    order: ZoneOrder
    restart_in_place: bool  # a STOP-terminated node of a model that restarts in place (Spot GPU VMs) is started again
    tiers: tuple[Tier, ...] = (Tier(model=DEFAULT_MODEL),)  # JobSpec.provisioning_tiers
    by_advice: bool = False  # placement.rank: advice: an advised model's zones ordered by capacity advice first

    @property
    def name(self) -> str:
        stages = ["restart_in_place"] * self.restart_in_place + [self.order + "_by_advice" * self.by_advice]
        for before, tier in zip(self.tiers, self.tiers[1:]):
            rules = [str(before.after_refusals)] if before.after_refusals is not None else []
            if before.after_preemptions is not None:
                p = before.after_preemptions
                rules.append(f"{p.max}_preemptions_per_{p.window_hours:g}h")
            stages.append(f"{models.of(tier.model).strategy_name}_after_{'_or_'.join(rules)}")
        return " → ".join(stages)

    def tier(self, status: SlotStatus, now: datetime, budget_used: float | None = None) -> tuple[Tier, str]:
        """The tier of the next node, and why the tiers before it were passed: each moves on after its refusals in a
        row (counted on from where the previous tier's ended) or while the job's preemptions exceed its limit. A
        tier past its while_budget_below (`budget_used`: the share of the budget spent) is not taken at all; when
        every tier is, the first one (the cap itself stops the job)."""
        refusals, why = status.consecutive_failures, []
        spent_out = [t for t in self.tiers if t.while_budget_below is not None and budget_used is not None
                     and budget_used >= t.while_budget_below]
        why += [f"{t.model}: {budget_used:.0%} of the budget spent (only below {t.while_budget_below:.0%})"
                for t in spent_out]
        # A reservation that ends (calendar mode) serves no node from near its end on: the next tier takes over.
        ended = [t for t in self.tiers if t.ends_at is not None and now >= t.ends_at - models.RUN_END_SLACK]
        why += [f"{t.model}: its reservation {t.reservation} ends at {t.ends_at.isoformat()}" for t in ended]
        tiers = [t for t in self.tiers if t not in spent_out and t not in ended] or list(self.tiers[:1])
        for tier in tiers[:-1]:
            p = tier.after_preemptions
            if p is not None and p.exceeded(status.preempted_times, now):
                why.append(f"{tier.model}: more than {p.max} preemptions within {p.window_hours:g} h")
            elif tier.after_refusals is not None and refusals >= tier.after_refusals:
                refusals -= tier.after_refusals
                why.append(f"{tier.model}: refused {tier.after_refusals} times in a row")
            else:
                return tier, "; ".join(why)
        return tiers[-1], "; ".join(why)

    def model(self, status: SlotStatus, now: datetime, budget_used: float | None = None) -> str:
        """The provisioning model of the next node."""
        return self.tier(status, now, budget_used)[0].model

    def in_place(self, status: SlotStatus, blocked: Mapping[str, datetime], now: datetime, max_restarts: int) -> bool:
        """Whether the current (stopped) node is started again in place: a node of a model that restarts in place
        (Spot), its zone not under a capacity cooldown, restarted in place fewer than `max_restarts` times."""
        if not self.restart_in_place or not models.of(status.provisioning).restarts_in_place:
            return False
        until = cooldowns(blocked, status.provisioning or DEFAULT_MODEL).get(status.zone or "")
        return (until is None or until <= now) and status.in_place_restarts < max_restarts

    def choose(self, zones: Sequence[str], status: SlotStatus, blocked: Mapping[str, datetime], now: datetime,
               advice: Mapping[str, ZoneAdvice] | None = None, budget_used: float | None = None) -> Choice:
        """The next node's zone (of `zones`: the slot's, membership.Slot) and model; zone None when every zone is
        cooling down or refused this round. `advice`: zone → capacity advice, which orders a Spot node's zones
        when the spec asks (placement.rank)."""
        tier, why = self.tier(status, now, budget_used)
        model = tier.model
        blocked = cooldowns(blocked, model)  # a Spot stockout leaves the other pools free to try
        # Zones that refused this round refused the model tried then: moving to another tier starts a new round.
        tried = status.tried_zones if status.provisioning in (None, model) else []
        skipped, eligible = [], []
        listed = list(zones)
        zones = models.of(model).zones(tier, listed)
        if self.by_advice and models.of(model).advised and advice:
            zones = placement.rank_zones(zones, advice)
        for zone in zones:
            until = blocked.get(zone)
            (skipped if (until is not None and until > now) or zone in tried else eligible).append(zone)
        # A zone that lost the node is tried last (or first: same_zone); a planned stop is no fault of its zone.
        lost_in = status.preempted_zone if status.last_cause != RUN_ENDED else None
        if lost_in in eligible and len(eligible) > 1 and self.order != "in_order":
            eligible.remove(lost_in)
            eligible.insert(0 if self.order == "same_zone" else len(eligible), lost_in)
        return Choice(eligible[0] if eligible else None, model, tuple(skipped), why,
                      tuple(zones) if self.by_advice and zones != listed else ())


def strategy_for(spec: JobSpec, tiers: Sequence[Tier] | None = None) -> Strategy:
    """The job's strategy, from its spec: placement.strategy (the older avoid_preempting_zone: false reads as
    in_order), a restart in place for GPU Spot VMs that a preemption stops, the provisioning tiers (`tiers`: a
    slot's, membership.Slot; by default the job's: the older on-demand fallback is two of them,
    JobSpec.provisioning_tiers), the zones by capacity advice (placement.rank)."""
    p = spec.placement
    order: ZoneOrder = p.strategy or ("next_zone" if p.avoid_preempting_zone else "in_order")
    stop_spot = spec.accelerator.kind == "gpu" and spec.termination_action == "STOP"
    walked = tuple(spec.provisioning_tiers if tiers is None else tiers)
    return Strategy(order, stop_spot, walked, spec.placement.rank == "advice")
