"""`respawn plan`'s provisioning comparison: the same job, with respawn's recovery, under four ways of getting
capacity (docs/job-spec.md, provisioning tiers), by Monte Carlo over Spot preemptions and Spot droughts.

- `spot`: every node on Spot. A drought (Spot stocked out in every listed zone) is waited out.
- `spot-flex-start`: Spot first; in a drought, after the tier's refusals (`tier_move_s`), a flex-start request waits
  for capacity (`flex_wait_minutes`, exponential), then runs unpreempted for `flex_run_hours` at `flex_price`. Before
  its end the node saves (a planned stop, nothing lost) and the next node is Spot again, or flex-start again while
  the drought lasts.
- `spot-on-demand`: Spot first; in a drought, after the tier's refusals, on-demand, which is never lost, so the job
  stays there to its end (every placement round starts at the first tier, and an on-demand node never ends one).
- `on-demand`: every node on demand: no preemption, `job_hours` plus one boot.

A drought begins after a Spot preemption with probability `spot_dry_probability` and lasts `spot_dry_hours`
(exponential); otherwise a preemption recovers as the `respawn` strategy does (plan_model.recovery_s, its zone
stockouts included). The job's Spot nodes move as one: a drought sends all of them to the next tier (in a real run
the survivors follow as each of them is lost); the spec's on-demand nodes (`on_demand_nodes`) stay on demand in
every row. Periodic checkpoints block for `stall_ratio` of a synchronous save every interval; a preemption loses the
work since the last checkpoint unless the emergency save fits the notice. Pure Python, no cloud.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from .plan_model import PlanInputs, emergency_fits, recovery_s, sync_save_s

POLICIES = ("spot", "spot-flex-start", "spot-on-demand", "on-demand")


@dataclass
class TierResult:
    policy: str
    wall_hours: float
    p90_wall_hours: float
    cost: float
    cost_vs_on_demand: float
    spot_hours: float  # node hours billed per tier (every node of the job)
    flex_start_hours: float
    on_demand_hours: float
    preemptions: float
    droughts: float  # Spot preemptions followed by a drought


class _Run:
    """One simulated run: the clock, the work done and committed, and the node hours billed per tier."""

    def __init__(self, p: PlanInputs):
        self.p = p
        self.wall = self.done = self.committed = 0.0
        self.hours = {"spot": 0.0, "flex-start": 0.0, "standard": 0.0}
        self.preemptions = self.droughts = 0
        self.need = p.job_hours * 3600
        # The loop blocks for an asynchronous checkpoint every interval: the wall seconds per second of training.
        self.rate = 1 + sync_save_s(p) * p.stall_ratio / (p.checkpoint_interval_min * 60)

    def bill(self, model: str, seconds: float) -> None:
        """`seconds` of every node on `model`; the spec's on-demand nodes bill on demand whatever the tier."""
        spot_nodes = self.p.nodes - self.p.on_demand_nodes
        self.hours[model] += spot_nodes * seconds / 3600
        self.hours["standard"] += self.p.on_demand_nodes * seconds / 3600

    def train(self, model: str, seconds: float) -> None:
        """Train for up to `seconds` of wall time (less when the job ends first), committing periodically."""
        interval = self.p.checkpoint_interval_min * 60
        wall = min(seconds, (self.need - self.done) * self.rate)
        start = self.done
        self.done += wall / self.rate
        # The newest periodic checkpoint at or before the work done (counted from this life's start).
        self.committed = max(self.committed, start + ((self.done - start) // interval) * interval)
        self.wall += wall
        self.bill(model, wall)

    def wait(self, model: str | None, seconds: float) -> None:
        """No training: booting and restoring bill `model`'s nodes (None: no node exists)."""
        self.wall += seconds
        if model is not None:
            self.bill(model, seconds)

    @property
    def finished(self) -> bool:
        return self.done >= self.need - 1e-6


def _simulate(policy: str, p: PlanInputs, rng: random.Random) -> _Run:
    run = _Run(p)
    restore = p.state_gb / p.read_gbps
    spot_nodes = p.nodes - p.on_demand_nodes
    if policy == "on-demand" or spot_nodes == 0:
        run.wait("standard", p.boot_s)
        run.train("standard", float("inf"))
        return run
    model, drought_end = "spot", 0.0
    run.wait("spot", p.boot_s)
    while not run.finished:
        if model == "spot":
            run.train("spot", rng.expovariate(spot_nodes / (p.mtbp_hours * 3600)))
            if run.finished:
                break
            run.preemptions += 1
            if emergency_fits(p):
                run.committed = run.done
            run.done = run.committed
            if rng.random() >= p.spot_dry_probability:
                recovery = recovery_s("respawn", p, rng, rng.random() < p.stockout_probability)
                run.wait("spot", recovery)
                continue
            run.droughts += 1
            drought_end = run.wall + rng.expovariate(1 / (p.spot_dry_hours * 3600))
            if policy == "spot":
                # Every zone refuses until the drought ends; then the replacement is created and boots.
                run.wait(None, max(0.0, drought_end - run.wall) + p.function_s)
                run.wait("spot", p.boot_s + restore)
                continue
            model = "flex-start" if policy == "spot-flex-start" else "standard"
            run.wait(None, p.tier_move_s)
        else:
            # A node of the next tier: a flex-start request first waits for capacity (nothing billed: PENDING).
            if model == "flex-start":
                run.wait(None, rng.expovariate(1 / (p.flex_wait_minutes * 60)))
            run.wait(model, p.boot_s + restore)
            if model == "standard":
                run.train("standard", float("inf"))
                break
            run.train("flex-start", p.flex_run_hours * 3600 - p.boot_s - restore)
            if run.finished:
                break
            # The run's end: the agent saves before it (a planned stop, nothing lost); the next node, made during
            # that notice, starts at the first tier again: Spot, or flex-start again while the drought lasts.
            run.wait("flex-start", sync_save_s(p))
            run.committed = run.done
            if run.wall < drought_end:
                run.wait(None, p.tier_move_s)
            else:
                model = "spot"
                run.wait("spot", p.function_s + p.boot_s + restore)
    return run


def compare(p: PlanInputs, on_demand_cost: float) -> list[TierResult]:
    """Each policy's mean over `p.runs` runs; common random numbers across policies (the same seed per run)."""
    prices = {"spot": p.spot_price, "flex-start": p.flex_price, "standard": p.on_demand_price}
    out = []
    for policy in POLICIES:
        runs = [_simulate(policy, p, random.Random(p.seed * 7919 + i)) for i in range(p.runs)]
        walls = sorted(r.wall for r in runs)
        costs = [sum(r.hours[m] * prices[m] for m in prices) for r in runs]
        mean = statistics.fmean
        out.append(TierResult(
            policy=policy, wall_hours=mean(walls) / 3600, p90_wall_hours=walls[int(0.9 * (len(walls) - 1))] / 3600,
            cost=mean(costs), cost_vs_on_demand=mean(costs) / on_demand_cost if on_demand_cost else 0.0,
            spot_hours=mean(r.hours["spot"] for r in runs), flex_start_hours=mean(r.hours["flex-start"] for r in runs),
            on_demand_hours=mean(r.hours["standard"] for r in runs), preemptions=mean(r.preemptions for r in runs),
            droughts=mean(r.droughts for r in runs)))
    return out
