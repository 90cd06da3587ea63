"""What `respawn plan` models a job with, shared by its strategy comparison (respawn.app.plan) and its provisioning
comparison (respawn.app.plan_tiers): the inputs, how long a checkpoint save takes and whether the emergency save fits
the notice, and how long one preemption's recovery takes under each strategy (respawn.app.plan's docstring says how each
recovers). Pure Python, no cloud.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from respawn.contract import DEFAULT_NOTICE_BUDGET_SECONDS, SOFT_OFF_SECONDS

@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan depends on. Defaults and their sources are in docs/plan.md."""

    job_hours: float = 24.0  # compute time the job needs with all its nodes healthy
    mtbp_hours: float = 6.0  # mean running time between preemptions, of one Spot node
    nodes: int = 1  # GPU VMs of the job, one training world
    on_demand_nodes: int = 0  # of them on-demand (the hybrid layout); the rest Spot
    min_nodes: int | None = None  # the elastic layout trains on this many while replacements boot; None: nodes
    spare_nodes: int = 0  # warm spares (JobSpec.spare_nodes), Spot, booted and set up: adds the spares row
    state_gb: float = 10.0  # checkpoint size
    checkpoint_interval_min: float = 30.0  # periodic checkpoint interval
    write_gbps: float = 0.35  # sustained fsync'd write throughput to the checkpoint store (GB/s)
    read_gbps: float = 0.5  # restore throughput
    stall_ratio: float = 0.05  # block time of an async periodic save / a synchronous save (bench.checkpoint)
    flush_vs_disk: float = 0.9  # emergency-save throughput / raw disk throughput (bench.checkpoint)
    notice_budget_s: float = DEFAULT_NOTICE_BUDGET_SECONDS  # what the emergency save may take of the 30 s notice
    notice_s: float = 0.0  # the job's notice before the soft-off (JobSpec.notice_seconds: 0 or 120, GPU Spot)
    function_s: float = 2.0  # the notice message → function start → reconcile: observe, decide, record, create call
    boot_s: float = 90.0  # VM create call → trainer running (GPU VM; a TPU VM takes longer)
    setup_s: float = 60.0  # extra relaunch setup of a whole new cluster (polling controller)
    restart_poll_s: float = 60.0  # the polling loop period of a poll-and-restart script
    restart_wait_s: float = 60.0  # such a script sleeps this long before recreating (the seeds: 60 s)
    polling_poll_s: float = 15.0  # SkyPilot's job-status poll
    restart_s: float = 60.0  # elastic: the world re-forms on other nodes (rendezvous, process start), restore aside
    spare_join_s: float = 15.0  # a ready spare's trainer starts and joins the generation, restore aside
    stockout_probability: float = 0.3  # chance that the preempting zone has no capacity afterwards
    stockout_minutes: float = 30.0  # mean length of such a stockout
    spot_price: float = 1.47  # $/h of the node on Spot
    on_demand_price: float = 3.67  # $/h of the same node on demand
    # The provisioning comparison (plan_tiers): Spot droughts, the tiers' move and flex-start.
    spot_dry_probability: float = 0.1  # chance that a Spot preemption begins a drought: Spot refused in every zone
    spot_dry_hours: float = 3.0  # mean length of a drought
    tier_move_s: float = 30.0  # the tier's refusals (a create per zone) before the next tier's node is asked for
    flex_price: float = 1.84  # $/h of the node as a flex-start VM
    flex_wait_minutes: float = 15.0  # mean wait of a flex-start request for capacity
    flex_run_hours: float = 24.0  # its run duration (the tier's max_run_hours: 10 min to 168 h)
    runs: int = 500
    seed: int = 0

    def validate(self) -> None:
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be a whole number of at least 1, got {self.nodes}")
        if not isinstance(self.on_demand_nodes, int) or not 0 <= self.on_demand_nodes <= self.nodes:
            raise ValueError(f"on_demand_nodes must be a whole number within 0..nodes ({self.nodes}), "
                             f"got {self.on_demand_nodes}")
        if self.min_nodes is not None and (not isinstance(self.min_nodes, int)
                                           or not 1 <= self.min_nodes <= self.nodes):
            raise ValueError(f"min_nodes must be a whole number within 1..nodes ({self.nodes}), got {self.min_nodes}")
        if not isinstance(self.spare_nodes, int) or self.spare_nodes < 0:
            raise ValueError(f"spare_nodes must be a whole number of at least 0, got {self.spare_nodes}")
        positive = ("job_hours", "mtbp_hours", "checkpoint_interval_min", "write_gbps", "read_gbps", "runs",
                    "spot_dry_hours", "flex_wait_minutes")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        non_negative = ("state_gb", "stall_ratio", "notice_budget_s", "function_s", "boot_s",
                        "setup_s", "restart_poll_s", "restart_wait_s", "polling_poll_s", "restart_s", "spare_join_s",
                        "stockout_minutes", "tier_move_s",
                        "spot_price", "on_demand_price", "flex_price")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 0 <= self.notice_s <= 120:
            raise ValueError(f"notice_s must be within 0..120 (Compute Engine's preemption notice duration), "
                             f"got {self.notice_s}")
        if not 0 <= self.spot_dry_probability <= 1:
            raise ValueError(f"spot_dry_probability must be within 0..1, got {self.spot_dry_probability}")
        if not 1 / 6 <= self.flex_run_hours <= 168:
            raise ValueError(f"flex_run_hours must be within 10 min..168 h (a flex-start VM's run duration), "
                             f"got {self.flex_run_hours}")
        if self.flex_run_hours * 3600 <= self.boot_s + self.state_gb / self.read_gbps + self.state_gb / self.write_gbps:
            raise ValueError(f"flex_run_hours ({self.flex_run_hours:g}) leaves no time to train after the boot, the "
                             "restore and the save before its end")
        if not 0 <= self.stockout_probability <= 1:
            raise ValueError(f"stockout_probability must be within 0..1, got {self.stockout_probability}")
        if not 0 < self.flush_vs_disk <= 1.5:
            raise ValueError(f"flush_vs_disk must be within (0, 1.5], got {self.flush_vs_disk}")




def sync_save_s(p: PlanInputs) -> float:
    return p.state_gb / p.write_gbps


def _window_s(p: PlanInputs) -> float:
    """From the notice until the node is off: the notice before the soft-off, then the soft-off's 30 s."""
    return p.notice_s + SOFT_OFF_SECONDS


def max_emergency_state_gb(p: PlanInputs) -> float:
    """The largest state an emergency checkpoint can commit within the notice budget (longer by notice_s)."""
    return (p.notice_budget_s + p.notice_s) * p.write_gbps * p.flush_vs_disk


def save_s(p: PlanInputs) -> float:
    """How long the noticed node's emergency save takes (it is cut at the budget)."""
    return min(p.state_gb / (p.write_gbps * p.flush_vs_disk), p.notice_budget_s + p.notice_s)


def emergency_fits(p: PlanInputs) -> bool:
    return p.state_gb <= max_emergency_state_gb(p)


def recovery_s(strategy: str, p: PlanInputs, rng: random.Random, stocked_out: bool) -> float:
    """Seconds from the preemption until the replacement is training again (restore included)."""
    restore = p.state_gb / p.read_gbps
    stockout = rng.expovariate(1 / (p.stockout_minutes * 60)) if stocked_out else 0.0
    if strategy == "poll-and-restart":
        detect = rng.uniform(0, p.restart_poll_s)
        # Same zone only: the recreate keeps failing until the stockout ends, retried every poll.
        wait_capacity = math.ceil(stockout / p.restart_poll_s) * p.restart_poll_s if stockout else 0.0
        return _window_s(p) + detect + p.restart_wait_s + wait_capacity + p.boot_s + restore
    if strategy == "polling":
        detect = rng.uniform(0, p.polling_poll_s)
        # Fails over to another zone, after one failed launch in the stocked-out zone.
        failed_try = p.boot_s / 3 if stocked_out else 0.0
        return _window_s(p) + detect + failed_try + p.boot_s + p.setup_s + restore
    # respawn (and hybrid): the agent tells the controller at the notice, which creates the replacement while the
    # noticed node saves; the new trainer starts once that save ended (the handover). A refused zone costs one failed
    # create call, then the job (one node, or all of them: too few survivors) moves to the next.
    failed_try = p.function_s if stocked_out else 0.0
    return p.function_s + failed_try + max(p.boot_s, save_s(p)) + restore
