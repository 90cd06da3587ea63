"""Goodput and cost planner: Monte Carlo runs of one training job under random preemptions, for three strategies.

- `poll-and-restart`: what a cron or monitor script does (the project's seed scripts). A 60 s polling loop notices
  the node is gone, waits, and recreates it in the same zone (so a stocked-out zone is waited out); periodic
  synchronous checkpoints only.
- `polling`: a polling controller that relaunches elsewhere without using the notice (SkyPilot managed jobs: a
  15 s status poll, a whole new cluster, failover across zones); periodic synchronous checkpoints only.
- `respawn`: the audit event reaches a function within the sink delay; the node is recreated in the next usable
  zone of the list; the notice triggers an emergency checkpoint, so no work is lost when the state fits the
  notice budget; periodic checkpoints are asynchronous (the loop blocks for `stall_ratio` of a sync save).

Pure Python, no cloud: `respawn plan` is its front end.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field, replace

from respawn.contract import DEFAULT_NOTICE_BUDGET_SECONDS

STRATEGIES = ("poll-and-restart", "polling", "respawn")


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan depends on. Defaults and their sources are in docs/plan.md."""

    job_hours: float = 24.0  # compute time the job needs on one healthy node
    mtbp_hours: float = 6.0  # mean running time between preemptions
    state_gb: float = 10.0  # checkpoint size
    checkpoint_interval_min: float = 30.0  # periodic checkpoint interval
    write_gbps: float = 0.35  # sustained fsync'd write throughput to the checkpoint store (GB/s)
    read_gbps: float = 0.5  # restore throughput
    stall_ratio: float = 0.05  # block time of an async periodic save / a synchronous save (bench.checkpoint)
    flush_vs_disk: float = 0.9  # emergency-save throughput / raw disk throughput (bench.checkpoint)
    notice_budget_s: float = DEFAULT_NOTICE_BUDGET_SECONDS  # what the emergency save may take of the 30 s notice
    sink_delay_s: float = 10.0  # audit log entry → Pub/Sub → function start
    function_s: float = 2.0  # reconcile: observe, decide, record, create call
    boot_s: float = 90.0  # VM create call → trainer running (GPU VM; a TPU VM takes longer)
    setup_s: float = 60.0  # extra relaunch setup of a whole new cluster (polling controller)
    restart_poll_s: float = 60.0  # the polling loop period of a poll-and-restart script
    restart_wait_s: float = 60.0  # such a script sleeps this long before recreating (the seeds: 60 s)
    polling_poll_s: float = 15.0  # SkyPilot's job-status poll
    stockout_probability: float = 0.3  # chance that the preempting zone has no capacity afterwards
    stockout_minutes: float = 30.0  # mean length of such a stockout
    spot_price: float = 1.47  # $/h of the node on Spot
    on_demand_price: float = 3.67  # $/h of the same node on demand
    runs: int = 500
    seed: int = 0

    def validate(self) -> None:
        positive = ("job_hours", "mtbp_hours", "checkpoint_interval_min", "write_gbps", "read_gbps", "runs")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        non_negative = ("state_gb", "stall_ratio", "notice_budget_s", "sink_delay_s", "function_s", "boot_s",
                        "setup_s", "restart_poll_s", "restart_wait_s", "polling_poll_s", "stockout_minutes",
                        "spot_price", "on_demand_price")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 0 <= self.stockout_probability <= 1:
            raise ValueError(f"stockout_probability must be within 0..1, got {self.stockout_probability}")
        if not 0 < self.flush_vs_disk <= 1.5:
            raise ValueError(f"flush_vs_disk must be within (0, 1.5], got {self.flush_vs_disk}")


@dataclass
class StrategyResult:
    strategy: str
    goodput: float  # share of wall time spent on steps that were not redone
    wall_hours: float
    downtime_hours: float  # no node training: detection, wait, boot, restore
    redone_hours: float  # training repeated after preemptions
    checkpoint_hours: float  # training loop blocked by checkpoints
    preemptions: float
    emergency_saved: float  # share of preemptions whose emergency checkpoint committed
    cost: float
    cost_vs_on_demand: float  # cost / the on-demand cost of the same job
    p90_wall_hours: float = 0.0


@dataclass
class Plan:
    inputs: PlanInputs
    on_demand_cost: float
    results: list[StrategyResult] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "inputs": asdict(self.inputs),
            "on_demand_cost": round(self.on_demand_cost, 2),
            "strategies": {r.strategy: {k: _round(v) for k, v in asdict(r).items() if k != "strategy"} for r in self.results},
        }


def _round(v):
    return round(v, 4) if isinstance(v, float) else v


def _sync_save_s(p: PlanInputs) -> float:
    return p.state_gb / p.write_gbps


def max_emergency_state_gb(p: PlanInputs) -> float:
    """The largest state an emergency checkpoint can commit within the notice budget."""
    return p.notice_budget_s * p.write_gbps * p.flush_vs_disk


def _emergency_fits(p: PlanInputs) -> bool:
    return p.state_gb <= max_emergency_state_gb(p)


def _recovery_s(strategy: str, p: PlanInputs, rng: random.Random, stocked_out: bool) -> float:
    """Seconds from the preemption until the replacement is training again (restore included)."""
    restore = p.state_gb / p.read_gbps
    stockout = rng.expovariate(1 / (p.stockout_minutes * 60)) if stocked_out else 0.0
    if strategy == "poll-and-restart":
        detect = rng.uniform(0, p.restart_poll_s)
        # Same zone only: the recreate keeps failing until the stockout ends, retried every poll.
        wait_capacity = math.ceil(stockout / p.restart_poll_s) * p.restart_poll_s if stockout else 0.0
        return 30 + detect + p.restart_wait_s + wait_capacity + p.boot_s + restore
    if strategy == "polling":
        detect = rng.uniform(0, p.polling_poll_s)
        # Fails over to another zone, after one failed launch in the stocked-out zone.
        failed_try = p.boot_s / 3 if stocked_out else 0.0
        return 30 + detect + failed_try + p.boot_s + p.setup_s + restore
    # respawn: the node dies at the end of the notice; the event arrives after the sink delay; a refused zone
    # costs one failed create call, then the next zone in the list is used.
    failed_try = p.function_s if stocked_out else 0.0
    return 30 + p.sink_delay_s + p.function_s + failed_try + p.boot_s + restore


def _simulate_run(strategy: str, p: PlanInputs, rng: random.Random) -> dict:
    need = p.job_hours * 3600
    interval = p.checkpoint_interval_min * 60
    block = _sync_save_s(p) * (p.stall_ratio if strategy == "respawn" else 1.0)
    emergency = strategy == "respawn" and _emergency_fits(p)
    done = committed = 0.0  # seconds of training done, and committed to a checkpoint
    wall = down = redone = ckpt = 0.0
    preemptions = saved = 0
    since_ckpt = 0.0
    while done < need:
        until_preempt = rng.expovariate(1 / (p.mtbp_hours * 3600))
        # Train until the job ends or the preemption hits, blocking for each periodic checkpoint.
        while done < need and until_preempt > 0:
            step = min(need - done, interval - since_ckpt, until_preempt)
            done += step
            since_ckpt += step
            wall += step
            until_preempt -= step
            if since_ckpt >= interval and done < need:
                if block >= until_preempt:
                    wall += until_preempt
                    ckpt += until_preempt
                    until_preempt = 0
                    break
                wall += block
                ckpt += block
                until_preempt -= block
                committed = done
                since_ckpt = 0.0
        if done >= need:
            break
        preemptions += 1
        if emergency:
            saved += 1
            committed = done
        redone += done - committed
        done = committed
        since_ckpt = 0.0
        recovery = _recovery_s(strategy, p, rng, rng.random() < p.stockout_probability)
        wall += recovery
        down += recovery
    useful = need
    billed_hours = (wall - down) / 3600 + preemptions * p.boot_s / 3600  # a booting node bills too
    return {
        "wall": wall, "down": down, "redone": redone, "ckpt": ckpt, "useful": useful,
        "preemptions": preemptions, "saved": saved, "cost": billed_hours * p.spot_price,
    }


def plan(p: PlanInputs, strategies: tuple[str, ...] = STRATEGIES) -> Plan:
    p.validate()
    on_demand_cost = (p.job_hours + p.boot_s / 3600) * p.on_demand_price
    result = Plan(inputs=p, on_demand_cost=on_demand_cost)
    for i, strategy in enumerate(strategies):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
        rng = random.Random(p.seed * 1000 + i)
        runs = [_simulate_run(strategy, p, rng) for _ in range(p.runs)]
        walls = sorted(r["wall"] for r in runs)
        mean = lambda key: statistics.fmean(r[key] for r in runs)  # noqa: E731
        n_pre = mean("preemptions")
        result.results.append(
            StrategyResult(
                strategy=strategy,
                goodput=statistics.fmean(r["useful"] / r["wall"] for r in runs),
                wall_hours=mean("wall") / 3600,
                downtime_hours=mean("down") / 3600,
                redone_hours=mean("redone") / 3600,
                checkpoint_hours=mean("ckpt") / 3600,
                preemptions=n_pre,
                emergency_saved=(mean("saved") / n_pre) if n_pre else 0.0,
                cost=mean("cost"),
                cost_vs_on_demand=mean("cost") / on_demand_cost if on_demand_cost else 0.0,
                p90_wall_hours=walls[int(0.9 * (len(walls) - 1))] / 3600,
            )
        )
    return result


def with_bench(p: PlanInputs, bench: dict) -> PlanInputs:
    """Take measured figures from a benchmark's --json object: checkpoint costs from `python -m bench.checkpoint`
    (stall_ratio, flush_vs_disk, raw_write_MBps, restore_seconds of size_mb MiB), the controller's time per event
    from `python -m bench.controller` (p50_ms). Keys a benchmark does not report leave the input as it was."""
    changes = {}
    if "stall_ratio" in bench:
        changes["stall_ratio"] = float(bench["stall_ratio"])
    if "flush_vs_disk" in bench:
        # Above 1 the plain sequential writer of the benchmark underestimated the disk (page cache, a first burst);
        # the emergency save cannot outrun the disk, so the plan takes the disk speed as its bound.
        changes["flush_vs_disk"] = min(float(bench["flush_vs_disk"]), 1.0)
    if "raw_write_MBps" in bench:
        changes["write_gbps"] = float(bench["raw_write_MBps"]) / 1000
    if "restore_seconds" in bench and bench.get("size_mb"):
        changes["read_gbps"] = float(bench["size_mb"]) * (1 << 20) / 1e9 / max(float(bench["restore_seconds"]), 1e-6)
    if "p50_ms" in bench:
        changes["function_s"] = float(bench["p50_ms"]) / 1000
    if not changes:
        raise ValueError("no figure respawn plan uses (expected the --json output of bench.checkpoint or "
                         "bench.controller)")
    return replace(p, **changes)


def svg_chart(result: Plan) -> str:
    """A self-contained SVG: goodput and cost against on-demand, one bar pair per strategy."""
    width, row = 560, 70
    height = 40 + row * len(result.results)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">',
        '<text x="10" y="20" font-weight="bold">goodput (blue) and cost vs on-demand (orange)</text>',
    ]
    for i, r in enumerate(result.results):
        y = 35 + i * row
        parts.append(f'<text x="10" y="{y + 22}">{r.strategy}</text>')
        for j, (value, colour) in enumerate(((r.goodput, "#3b7dd8"), (r.cost_vs_on_demand, "#e8913a"))):
            w = max(1, int(380 * min(value, 1.5) / 1.5))
            parts.append(f'<rect x="90" y="{y + 4 + j * 24}" width="{w}" height="20" fill="{colour}"/>')
            parts.append(f'<text x="{96 + w}" y="{y + 19 + j * 24}">{value:.0%}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
