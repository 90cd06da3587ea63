"""Goodput and cost planner: Monte Carlo runs of one training job under random preemptions, for several strategies.

- `poll-and-restart`: what a cron or monitor script does (the project's seed scripts). A 60 s polling loop notices
  the node is gone, waits, and recreates it in the same zone (so a stocked-out zone is waited out); periodic
  synchronous checkpoints only.
- `polling`: a polling controller that relaunches elsewhere without using the notice (SkyPilot managed jobs: a
  15 s status poll, a whole new cluster, failover across zones); periodic synchronous checkpoints only.
- `respawn`: the audit event reaches a function within the sink delay; the node is recreated in the next usable
  zone of the list; the notice triggers an emergency checkpoint, so no work is lost when the state fits the
  notice budget; periodic checkpoints are asynchronous (the loop blocks for `stall_ratio` of a sync save).

These three run every node on Spot. The job runs on `nodes` GPU VMs (one zone, one training world) and needs
`job_hours` with all of them training. Each Spot node is preempted at the rate 1/`mtbp_hours` of its running time,
so a job of N Spot nodes is interrupted N times as often as a one-node job. Any node's loss stops every rank: it
costs the work since the last committed checkpoint (none when the emergency save fits) and the recovery time,
during which the surviving nodes keep their VMs and bill, idle. `polling` relaunches a whole new cluster instead
(the survivors are let go; N nodes boot). For `respawn` a replacement joins the others' zone; when that zone
refuses it and fewer than `min_nodes` survive, the whole job moves to the next zone of its list
(respawn.control.membership.plan): one failed create, then every node boots there, as a one-node job moves.
Preemptions of idle survivors during a recovery are not drawn.

Two more layouts, both with respawn's recovery, are planned when the inputs ask for them:

- `hybrid` (`on_demand_nodes` ≥ 1): that many nodes are on-demand, at `on_demand_price`, and never preempted; the
  rest are Spot. Interruptions come from the Spot nodes only, at (nodes - on_demand_nodes)/`mtbp_hours`.
- `elastic` (`min_nodes` < `nodes`; the node mix of `hybrid`, all Spot when on_demand_nodes is 0): when a node is
  lost and at least `min_nodes` remain, the survivors re-form the training world at once (the notice, `restart_s`,
  a restore) and train at survivors/nodes of the full throughput while the replacement boots; when it is ready the
  world stops once more to take it back (a synchronous save, `restart_s`, a restore). Below `min_nodes` the job
  waits for replacements as the others do. Failures of the degraded world are drawn at its own Spot count.

One more, when `spare_nodes` ≥ 1:

- `spares`: respawn's recovery with the hybrid node mix and `spare_nodes` warm spares: Spot VMs booted and set up in
  the job's zone, waiting. A member loss while a spare is ready costs the function, the longer of the spare's
  trainer start and join (`spare_join_s`) and the noticed node's emergency save (the handover), and the restore: no
  create, boot or stockout. The lost slot's replacement is created at once and is the next ready spare `boot_s`
  later (in a stocked-out zone it waits the stockout out: spares stay in the job's zone). With no spare ready the
  loss recovers as respawn's does. A spare is preempted at the members' per-node rate from the moment it is up (a
  booting one is not drawn); its slot's replacement boots as above and training does not notice. Each spare slot
  bills Spot for the whole wall time (the seconds a slot stands empty between a preemption and the next create are
  billed too: a slight overcount). `Plan.spares` sets the row against the same layout without spares (respawn, or
  hybrid). Not modelled: a spare that comes up while a loss waits for a fresh replacement does not take its place;
  a move of the whole job to another zone (a refused replacement, no spare ready) takes the spares along at no cost.

The on-demand baseline (`Plan.on_demand_cost`) is every node on demand for `job_hours` plus a boot.

Pure Python, no cloud: `respawn plan` is its front end.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from . import plan_tiers
from .plan_model import PlanInputs, emergency_fits, recovery_s, save_s, sync_save_s

ALL_SPOT = ("poll-and-restart", "polling", "respawn")
STRATEGIES = (*ALL_SPOT, "hybrid", "elastic", "spares")


@dataclass
class StrategyResult:
    strategy: str
    goodput: float  # share of wall time spent on steps that were not redone
    wall_hours: float
    downtime_hours: float  # no node training: detection, wait, boot, restore (elastic: also its restarts)
    redone_hours: float  # training repeated after preemptions
    checkpoint_hours: float  # training loop blocked by checkpoints
    preemptions: float
    emergency_saved: float  # share of preemptions whose emergency checkpoint committed
    cost: float
    cost_vs_on_demand: float  # cost / the on-demand cost of the same job
    p90_wall_hours: float = 0.0
    degraded_hours: float = 0.0  # elastic: training on fewer than all nodes


@dataclass
class SparesEffect:
    """What the `spares` row's warm spares cost and save, against the row of the same layout without them (means
    per run)."""

    spare_nodes: int
    against: str  # the row without spares: respawn, or hybrid when some nodes are on demand
    cost: float  # the spares' own bill: Spot, every slot the whole wall time
    spare_preemptions: float  # of the spares themselves: each one replaced, training unaffected
    joined: float  # share of member losses a ready spare took (the others recovered as without spares)
    recovery_saved_s: float  # downtime per member loss: without spares, less with them
    downtime_saved_hours: float
    wall_saved_hours: float
    recovery_cost_saved: float  # the rest of the bill (idle survivors, replacement boots, a longer run) less with
    net: float  # the spares row's cost less the other's: positive where the spares cost more than they save


@dataclass
class Plan:
    inputs: PlanInputs
    on_demand_cost: float
    results: list[StrategyResult] = field(default_factory=list)
    spares: SparesEffect | None = None  # when the spares row and the one it is set against are both planned
    provisioning: list = field(default_factory=list)  # plan_tiers.TierResult: the four ways of getting capacity

    def to_json(self) -> dict:
        out = {
            "inputs": asdict(self.inputs),
            "on_demand_cost": round(self.on_demand_cost, 2),
            "strategies": {r.strategy: {k: _round(v) for k, v in asdict(r).items() if k != "strategy"} for r in self.results},
        }
        if self.spares is not None:
            out["spares"] = {k: _round(v) for k, v in asdict(self.spares).items()}
        if self.provisioning:
            out["provisioning"] = {r.policy: {k: _round(v) for k, v in asdict(r).items() if k != "policy"}
                                   for r in self.provisioning}
        return out


def _round(v):
    return round(v, 4) if isinstance(v, float) else v



def _spare_recovery_s(p: PlanInputs) -> float:
    """Seconds from the notice until a ready spare trains in the lost member's place: respawn's recovery with the
    spare's trainer start in place of a create and boot, and no stockout (the spare is already in the zone)."""
    return p.function_s + max(p.spare_join_s, save_s(p)) + p.state_gb / p.read_gbps


def _replacement_s(p: PlanInputs, stockout: float, move: bool) -> float:
    """Seconds from the notice until the replacement of one node of an elastic job, or of a spare, is up, restore
    not included. While enough survivors train on in the zone (and always for a spare), the replacement waits out a
    stockout there (`stockout` seconds long; the create call made when it ends is one more function run); with too
    few (`move`), a stockout moves the job to the next zone after one failed create, as respawn's recovery does."""
    if move:
        return p.function_s + (p.function_s if stockout else 0.0) + max(p.boot_s, save_s(p))
    waited = stockout + p.function_s if stockout else 0.0
    return p.function_s + waited + p.boot_s


def _draw_stockout(p: PlanInputs, rng: random.Random) -> float:
    return rng.expovariate(1 / (p.stockout_minutes * 60)) if rng.random() < p.stockout_probability else 0.0


def _until_preempt(spot_nodes: int, p: PlanInputs, rng: random.Random) -> float:
    """Running time until the next preemption among `spot_nodes` Spot nodes, each at rate 1/mtbp."""
    return rng.expovariate(spot_nodes / (p.mtbp_hours * 3600)) if spot_nodes else math.inf


def _simulate_run(strategy: str, p: PlanInputs, rng: random.Random, spare_rng: random.Random | None = None) -> dict:
    """One run in which every loss stops the job until its replacement (or a ready spare) is training: the all-Spot
    strategies, hybrid (respawn's recovery, `on_demand_nodes` of the nodes never preempted), and spares (hybrid's
    layout with `spare_nodes` warm spares; with none it is hybrid draw for draw). The spares' own preemptions are
    drawn from `spare_rng` (default `rng`), so that `rng` draws the members' losses exactly as without spares."""
    spare_rng = spare_rng or rng
    hybrid = strategy in ("hybrid", "spares")
    mechanics = "respawn" if hybrid else strategy
    on_demand = p.on_demand_nodes if hybrid else 0
    spares = p.spare_nodes if strategy == "spares" else 0
    ready_at = [0.0] * spares  # per spare slot: when its VM is up and waiting (wall time)
    lost_at = [_until_preempt(1, p, spare_rng) for _ in range(spares)]  # and when that VM's notice comes
    spare_preemptions = joined = 0
    spare_down = 0.0  # downtime of the recoveries a spare took

    def spares_until(now: float) -> None:
        """Play each spare slot's own preemptions up to `now`: a preempted spare's replacement waits out a stockout
        in the zone, boots, and is preempted in its turn."""
        nonlocal spare_preemptions
        for j in range(spares):
            while lost_at[j] <= now:
                spare_preemptions += 1
                ready_at[j] = lost_at[j] + _replacement_s(p, _draw_stockout(p, spare_rng), move=False)
                lost_at[j] = ready_at[j] + _until_preempt(1, p, spare_rng)

    spot = p.nodes - on_demand
    need = p.job_hours * 3600
    interval = p.checkpoint_interval_min * 60
    block = sync_save_s(p) * (p.stall_ratio if mechanics == "respawn" else 1.0)
    emergency = mechanics == "respawn" and emergency_fits(p)
    done = committed = 0.0  # seconds of training done, and committed to a checkpoint
    wall = down = redone = ckpt = 0.0
    preemptions = saved = 0
    since_ckpt = 0.0
    while done < need:
        until_preempt = _until_preempt(spot, p, rng)
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
        spares_until(wall)
        ready = [j for j in range(spares) if ready_at[j] <= wall]
        if ready:
            # The spare takes the lost member's place; the slot's replacement is created now and waits as a spare.
            # Its stockout is drawn from `rng` as the recovery without a spare draws one: the streams stay aligned.
            joined += 1
            recovery = _spare_recovery_s(p)
            spare_down += recovery
            ready_at[ready[0]] = wall + _replacement_s(p, _draw_stockout(p, rng), move=False)
            lost_at[ready[0]] = ready_at[ready[0]] + _until_preempt(1, p, spare_rng)
        else:
            recovery = recovery_s(mechanics, p, rng, rng.random() < p.stockout_probability)
        wall += recovery
        down += recovery
    spares_until(wall)
    useful = need
    # Node time billed: every node while the job trains; the survivors through a recovery (a polling controller
    # lets them go and relaunches the whole cluster), and the spare that joins through its recovery; each node that
    # boots as a member (a booting node bills too); every spare slot all along (a replacement that boots into one
    # is in its bill).
    idle_survivors, boots = (0, p.nodes) if mechanics == "polling" else (p.nodes - 1, 1)
    node_hours = p.nodes * (wall - down) / 3600 + idle_survivors * down / 3600 + (
        preemptions - joined) * boots * p.boot_s / 3600 + (spare_down + spares * wall) / 3600
    on_demand_hours = on_demand * wall / 3600  # never preempted: billed all along, at the on-demand price
    return {
        "wall": wall, "down": down, "redone": redone, "ckpt": ckpt, "useful": useful, "degraded": 0.0,
        "preemptions": preemptions, "saved": saved,
        "cost": (node_hours - on_demand_hours) * p.spot_price + on_demand_hours * p.on_demand_price,
        "spare_cost": spares * wall / 3600 * p.spot_price, "spare_preemptions": spare_preemptions, "joined": joined,
    }


def _simulate_elastic(p: PlanInputs, rng: random.Random, min_nodes: int) -> dict:
    """One run of the elastic layout (respawn's recovery and checkpoints, the hybrid node mix): a loss that leaves
    at least `min_nodes` re-forms the world on the survivors, which train at survivors/nodes of the full rate until
    the replacement is ready and taken back. With min_nodes = nodes it is the hybrid model, by another route."""
    n, on_demand = p.nodes, p.on_demand_nodes
    need = p.job_hours * 3600  # in full-world seconds
    interval = p.checkpoint_interval_min * 60
    block = sync_save_s(p) * p.stall_ratio
    restore = p.state_gb / p.read_gbps
    emergency = emergency_fits(p)
    done = committed = since_ckpt = 0.0
    wall = down = degraded = redone = ckpt = node_s = 0.0
    active = n  # nodes in the training world (or waiting to be)
    pending: list[float] = []  # wall times at which replacements are up, earliest first
    preemptions = saved = 0

    def elapse(seconds: float, training: bool) -> None:
        nonlocal wall, down, degraded, node_s
        wall += seconds
        node_s += active * seconds  # every node that exists bills, training or not
        if not training:
            down += seconds
        elif active < n:
            degraded += seconds

    while done < need:
        if active < min_nodes:
            # Too few to train: wait for replacements; the survivors' processes restart meanwhile, so only the
            # restore is left when enough are up. Those already up join now rather than at a later restart.
            elapse(max(0.0, pending.pop(0) - wall), False)
            joined = 1
            while pending and pending[0] <= wall:
                pending.pop(0)
                joined += 1
            if active + joined >= min_nodes:
                elapse(restore, False)  # billed as _simulate_run bills it: a new node's bill is its boot
            active += joined
            continue
        rate = active / n
        until_fail = _until_preempt(active - on_demand, p, rng)
        until_ready = max(0.0, pending[0] - wall) if pending else math.inf
        left = min(until_fail, until_ready)
        # Train until the job ends or the event, blocking for each periodic checkpoint (as _simulate_run).
        while done < need and left > 0:
            step = min((need - done) / rate, interval - since_ckpt, left)
            done = min(need, done + step * rate)
            since_ckpt += step
            elapse(step, True)
            left -= step
            if since_ckpt >= interval and done < need:
                if block >= left:
                    elapse(left, True)
                    ckpt += left
                    left = 0
                    break
                elapse(block, True)
                ckpt += block
                left -= block
                committed = done
                since_ckpt = 0.0
        if done >= need:
            break
        since_ckpt = 0.0
        if until_fail <= until_ready:
            preemptions += 1
            if emergency:
                saved += 1
                committed = done
            redone += done - committed
            done = committed
            active -= 1
            pending.append(wall + _replacement_s(p, _draw_stockout(p, rng), move=active < min_nodes))
            pending.sort()
            if active >= min_nodes:
                elapse(30 + p.restart_s + restore, False)  # the world stops at the notice and re-forms without it
        else:
            # The replacement is up: commit a checkpoint (synchronously: the world is about to stop), then re-form
            # the world with it. It bills from now on.
            pending.pop(0)
            active += 1
            save = sync_save_s(p)
            elapse(save, True)
            ckpt += save
            committed = done
            elapse(p.restart_s + restore, False)
    node_hours = (node_s + preemptions * p.boot_s) / 3600
    on_demand_hours = on_demand * wall / 3600
    return {
        "wall": wall, "down": down, "redone": redone, "ckpt": ckpt, "useful": need, "degraded": degraded,
        "preemptions": preemptions, "saved": saved,
        "cost": (node_hours - on_demand_hours) * p.spot_price + on_demand_hours * p.on_demand_price,
    }


def default_strategies(p: PlanInputs) -> tuple[str, ...]:
    """The all-Spot strategies, and hybrid, elastic and spares where the inputs describe them."""
    extra = ("hybrid",) if p.on_demand_nodes else ()
    if p.min_nodes is not None and p.min_nodes < p.nodes:
        extra += ("elastic",)
    if p.spare_nodes:
        extra += ("spares",)
    return ALL_SPOT + extra


def _spares_against(p: PlanInputs) -> str:
    """The row of the spares row's layout without spares."""
    return "hybrid" if p.on_demand_nodes else "respawn"


def _spares_effect(p: PlanInputs, rows: dict[str, StrategyResult], runs: list[dict]) -> SparesEffect | None:
    """The spares row (`runs` are its simulated runs) against the row of its layout without spares, if planned."""
    against = _spares_against(p)
    if against not in rows:
        return None
    with_, without = rows["spares"], rows[against]
    cost = statistics.fmean(r["spare_cost"] for r in runs)

    def per_loss(r: StrategyResult) -> float:
        return r.downtime_hours * 3600 / r.preemptions if r.preemptions else 0.0

    return SparesEffect(
        spare_nodes=p.spare_nodes, against=against, cost=cost,
        spare_preemptions=statistics.fmean(r["spare_preemptions"] for r in runs),
        joined=statistics.fmean(r["joined"] for r in runs) / with_.preemptions if with_.preemptions else 0.0,
        recovery_saved_s=per_loss(without) - per_loss(with_),
        downtime_saved_hours=without.downtime_hours - with_.downtime_hours,
        wall_saved_hours=without.wall_hours - with_.wall_hours,
        recovery_cost_saved=without.cost - (with_.cost - cost),
        net=with_.cost - without.cost,
    )


def plan(p: PlanInputs, strategies: tuple[str, ...] | None = None) -> Plan:
    p.validate()
    if strategies is None:
        strategies = default_strategies(p)
    p = replace(p, min_nodes=p.nodes if p.min_nodes is None else p.min_nodes)
    on_demand_cost = p.nodes * (p.job_hours + p.boot_s / 3600) * p.on_demand_price
    result = Plan(inputs=p, on_demand_cost=on_demand_cost)
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
        if strategy == "hybrid" and not p.on_demand_nodes:
            raise ValueError("hybrid needs on_demand_nodes of at least 1 (the nodes that run on demand)")
        if strategy == "elastic" and p.min_nodes >= p.nodes:
            raise ValueError(f"elastic needs min_nodes below nodes ({p.nodes}), got {p.min_nodes}")
        if strategy == "spares" and not p.spare_nodes:
            raise ValueError("spares needs spare_nodes of at least 1 (the warm spares it keeps)")
    spare_runs: list[dict] = []
    for i, strategy in enumerate(strategies):
        rng = random.Random(p.seed * 1000 + i)
        if strategy == "elastic":
            runs = [_simulate_elastic(p, rng, p.min_nodes) for _ in range(p.runs)]
        elif strategy == "spares":
            # Common random numbers: the members' losses are drawn as for the row without spares (its seed), the
            # spares' own preemptions from this row's, so the two rows differ by what the spares do alone.
            members = _spares_against(p)
            member_rng = random.Random(p.seed * 1000 + strategies.index(members)) if members in strategies else rng
            runs = spare_runs = [_simulate_run(strategy, p, member_rng, rng) for _ in range(p.runs)]
        else:
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
                degraded_hours=mean("degraded") / 3600,
            )
        )
    if "spares" in strategies:
        result.spares = _spares_effect(p, {r.strategy: r for r in result.results}, spare_runs)
    result.provisioning = plan_tiers.compare(p, on_demand_cost)
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


def from_spec(spec: Any) -> tuple[dict[str, Any], list[str]]:
    """The plan's inputs a job spec (schema.JobSpec) gives: its layout (nodes, on-demand nodes, min and spare nodes,
    the notice) and its node's prices an hour in its first zone's region (Spot, or preemptible, and on demand; the
    offline table's, respawn/prices.py, named), with a line each saying where they came from. A spec keeps no
    checkpoint interval (its trainer decides): that stays the plan's input."""
    from respawn import prices

    got: dict[str, Any] = {"nodes": spec.nodes, "on_demand_nodes": spec.on_demand_nodes,
                           "spare_nodes": spec.spare_nodes, "notice_s": float(spec.notice_seconds)}
    if spec.min_nodes is not None:
        got["min_nodes"] = spec.min_nodes
    acc = spec.accelerator
    node = getattr(acc, "machine_type", None) or acc.accelerator_type
    count = getattr(acc, "accelerator_count", 0) if getattr(acc, "accelerator_type", None) and acc.kind == "gpu" else 0
    said = [f"{spec.nodes} × {node}" + (f" with {count} × {acc.accelerator_type}" if count else "")
            + f" in {', '.join(spec.zones)}"]
    region = prices.region_of(spec.zones[0])
    book = prices.offline(region)
    model = spec.provisioning if spec.provisioning in ("spot", "preemptible") else "spot"
    quote = prices.quote(acc, book) if book is not None else None
    spot, flex = (quote.rates.get(model), quote.rates.get("flex-start")) if quote is not None else (None, None)
    if spot is None:
        why = quote.why if quote is not None else f"the offline table has no prices for {region}"
        said.append(f"prices: {why}; the plan's --spot-price and --on-demand-price are used")
    else:
        got.update(spot_price=spot.usd_per_hour, on_demand_price=spot.on_demand_usd_per_hour)
        if flex is not None:
            got["flex_price"] = flex.usd_per_hour
        said.append(f"{model} ${spot.usd_per_hour:.4g}/h, on demand ${spot.on_demand_usd_per_hour:.4g}/h a node "
                    f"({spot.note})")
    return got, said
