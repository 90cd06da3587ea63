"""Recovery strategies: where a job's next node goes, and on what terms. Pure. Chosen in one place (strategy_for),
a strategy answers every placement question decide.py asks, so a new way of getting capacity is a new strategy,
not a branch in decide.py: may the lost node be started again in place (`in_place`), which provisioning model the
next node asks for (`model`), which zone (`choose`, by the strategy's zone order: docs/job-spec.md,
placement.strategy). Every order skips the zones cooling down (every job's refusals) and those that refused the job
in the current round.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping

from respawn.schema import JobSpec, SlotStatus, ZoneOrder


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


@dataclass(frozen=True)
class Strategy:
    order: ZoneOrder
    restart_in_place: bool  # a STOP-terminated Spot GPU VM is started again where it stands
    fallback_after: int | None  # refusals in a row after which the next node is on-demand; None: never

    @property
    def name(self) -> str:
        stages = ["restart_in_place"] * self.restart_in_place + [self.order]
        if self.fallback_after is not None:
            stages.append(f"on_demand_after_{self.fallback_after}")
        return " → ".join(stages)

    def model(self, spec: JobSpec, status: SlotStatus) -> str:
        """The provisioning model of the next node."""
        if self.fallback_after is not None and status.consecutive_failures >= self.fallback_after:
            return "standard"
        return spec.provisioning

    def in_place(self, status: SlotStatus, blocked: Mapping[str, datetime], now: datetime, max_restarts: int) -> bool:
        """Whether the current (stopped) node is started again in place: a Spot node, its zone not under a
        capacity cooldown, restarted in place fewer than `max_restarts` times."""
        if not self.restart_in_place or status.provisioning != "spot":
            return False
        until = blocked.get(status.zone or "")
        return (until is None or until <= now) and status.in_place_restarts < max_restarts

    def choose(self, spec: JobSpec, status: SlotStatus, blocked: Mapping[str, datetime], now: datetime) -> Choice:
        """The next node's zone and model; zone None when every zone is cooling down or refused this round."""
        model = self.model(spec, status)
        # Zones that refused this round refused the model tried then: falling back to on-demand starts a new round.
        tried = status.tried_zones if status.provisioning in (None, model) else []
        skipped, eligible = [], []
        for zone in spec.zones:
            until = blocked.get(zone)
            (skipped if (until is not None and until > now) or zone in tried else eligible).append(zone)
        lost_in = status.preempted_zone
        if lost_in in eligible and len(eligible) > 1 and self.order != "in_order":
            eligible.remove(lost_in)
            eligible.insert(0 if self.order == "same_zone" else len(eligible), lost_in)
        return Choice(eligible[0] if eligible else None, model, tuple(skipped))


def strategy_for(spec: JobSpec) -> Strategy:
    """The job's strategy, from its spec: placement.strategy (the older avoid_preempting_zone: false reads as
    in_order), a restart in place for GPU Spot VMs that a preemption stops, the on-demand fallback when allowed."""
    p = spec.placement
    order: ZoneOrder = p.strategy or ("next_zone" if p.avoid_preempting_zone else "in_order")
    stop_spot = spec.accelerator.kind == "gpu" and spec.termination_action == "STOP"
    falls_back = p.on_demand_fallback and spec.provisioning != "standard"
    return Strategy(order, stop_spot, p.fallback_after_failures if falls_back else None)
