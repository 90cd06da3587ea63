"""The goodput planner: the simulation's behaviour, and the `respawn plan` command."""

from __future__ import annotations

import json
import os
from pathlib import Path
from dataclasses import replace

import pytest

from tests import respawn_forks
from respawn.app.plan import PlanInputs, plan, with_bench
from respawn.app.plan_model import max_emergency_state_gb

FAST = dict(job_hours=12.0, runs=150, seed=7)


def plan_cli(argv: list[str], env: dict | None = None):
    """`python -m respawn ARGV` with its output captured as text, forked from one process that has imported the CLI
    (tests/respawn_forks.py: test_cli_errors.py checks that a forked run says what a real one says)."""
    return respawn_forks.run(argv, Path.cwd(), dict(os.environ) if env is None else env, timeout=60)


def by_name(result):
    return {r.strategy: r for r in result.results}


def test_without_preemptions_only_checkpoints_cost_goodput():
    r = by_name(plan(PlanInputs(mtbp_hours=1e9, **FAST)))
    for s in r.values():
        assert s.preemptions == 0 and s.redone_hours == 0 and s.downtime_hours == 0
        assert s.goodput == pytest.approx(12.0 / s.wall_hours)
    # Async periodic saves block the loop for a fraction of a synchronous save.
    assert r["respawn"].checkpoint_hours == pytest.approx(r["poll-and-restart"].checkpoint_hours * 0.05, rel=1e-6)


def test_emergency_checkpoint_that_fits_loses_no_work():
    inputs = PlanInputs(state_gb=2.0, **FAST)
    assert inputs.state_gb <= max_emergency_state_gb(inputs)
    r = by_name(plan(inputs))
    assert r["respawn"].preemptions > 0
    assert r["respawn"].emergency_saved == 1.0 and r["respawn"].redone_hours == 0
    assert r["poll-and-restart"].redone_hours > 0 and r["polling"].redone_hours > 0
    assert r["respawn"].goodput > r["polling"].goodput > r["poll-and-restart"].goodput


def test_state_too_large_for_the_notice_falls_back_to_periodic_checkpoints():
    inputs = PlanInputs(state_gb=40.0, **FAST)
    r = by_name(plan(inputs))
    assert r["respawn"].emergency_saved == 0 and r["respawn"].redone_hours > 0


def test_same_zone_recreate_waits_out_stockouts():
    r = by_name(plan(PlanInputs(stockout_probability=1.0, stockout_minutes=60, **FAST)))
    no_stockout = by_name(plan(PlanInputs(stockout_probability=0.0, **FAST)))
    per_preemption = {k: v.downtime_hours / v.preemptions for k, v in r.items()}
    assert per_preemption["poll-and-restart"] > 0.5  # about the hour-long stockout, every time
    assert per_preemption["respawn"] < 0.1  # moves to the next zone in the list
    assert r["respawn"].downtime_hours / r["respawn"].preemptions == pytest.approx(
        no_stockout["respawn"].downtime_hours / no_stockout["respawn"].preemptions, rel=0.05
    )


def test_spot_costs_less_than_on_demand_and_runs_are_reproducible():
    a, b = plan(PlanInputs(**FAST)), plan(PlanInputs(**FAST))
    assert a.to_json() == b.to_json()
    for s in a.results:
        assert 0 < s.cost_vs_on_demand < 1


@pytest.mark.parametrize(
    "field, value, message",
    [("mtbp_hours", 0, "mtbp_hours must be positive"), ("stockout_probability", 2, "within 0..1"),
     ("boot_s", -1, "boot_s must not be negative")],
)
def test_bad_inputs_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        plan(PlanInputs(**{**FAST, field: value}))


def test_bench_figures_feed_the_plan():
    # The keys bench.checkpoint --json and bench.controller --json print (their smoke tests run the real thing).
    p = with_bench(PlanInputs(), {"stall_ratio": 0.02, "flush_vs_disk": 0.95, "raw_write_MBps": 700.0,
                                  "restore_seconds": 2.0, "size_mb": 1024.0})
    assert (p.stall_ratio, p.flush_vs_disk, p.write_gbps) == (0.02, 0.95, 0.7)
    assert p.read_gbps == pytest.approx(1024 * 2**20 / 1e9 / 2)
    assert with_bench(p, {"p50_ms": 250.0, "storm_seconds": 9.0}).function_s == 0.25
    # An emergency save measured faster than the raw writer is bounded by the disk (the ratio is capped at 1).
    assert with_bench(p, {"flush_vs_disk": 1.8}).flush_vs_disk == 1.0
    with pytest.raises(ValueError, match="no figure"):
        with_bench(p, {"something": 1})


def test_plan_command_prints_json_and_writes_a_chart(tmp_path):
    chart = tmp_path / "plan.svg"
    r = plan_cli(["plan", "--runs", "40", "--json", "--plot", str(chart), "--set", "state_gb=3"])
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(body["strategies"]) == {"poll-and-restart", "polling", "respawn"}
    assert body["inputs"]["state_gb"] == 3.0
    svg = chart.read_text()
    assert svg.startswith("<svg") and all(name in svg for name in ("poll-and-restart", "polling", "respawn"))


def test_plan_command_rejects_unknown_settings():
    r = plan_cli(["plan", "--set", "mtpb=3"])
    assert r.returncode == 2 and "expected NAME=VALUE with NAME one of" in r.stderr and "Traceback" not in r.stderr


# Several nodes (issue #16): the per-node preemption rate, the hybrid and elastic layouts.
MULTI = dict(job_hours=12.0, runs=300, seed=3, state_gb=2.0)  # the emergency save fits: losses cost recovery only


def per_training_hour(s):
    return s.preemptions / (s.wall_hours - s.downtime_hours)


def test_n_spot_nodes_are_interrupted_n_times_as_often_and_cost_n_times_the_nodes():
    one = by_name(plan(PlanInputs(**MULTI)))
    four = by_name(plan(PlanInputs(nodes=4, **MULTI)))
    for name in ("poll-and-restart", "polling", "respawn"):
        assert per_training_hour(four[name]) == pytest.approx(4 * per_training_hour(one[name]), rel=0.12), name
        # Four nodes bill four times the node hours at least (more: recoveries are 4x as frequent, survivors idle).
        assert four[name].cost > 4 * one[name].cost
    assert plan(PlanInputs(nodes=4, **MULTI)).on_demand_cost == pytest.approx(4 * plan(PlanInputs(**MULTI)).on_demand_cost)
    # Every loss stops all ranks: four nodes spend about four times as long recovering.
    assert four["respawn"].downtime_hours > 3 * one["respawn"].downtime_hours


def test_a_refused_replacement_moves_the_whole_job_as_one_node_moves():
    # min_nodes = nodes: the survivors cannot train without the refused slot, so the job moves to the next zone
    # (one failed create, then every node boots there) instead of waiting out the hour-long stockout.
    stocked = dict(MULTI, stockout_probability=1.0, stockout_minutes=60)
    for nodes in (1, 2, 4):
        r = by_name(plan(PlanInputs(nodes=nodes, **stocked)))
        assert r["respawn"].downtime_hours / r["respawn"].preemptions < 0.1, nodes
        assert r["poll-and-restart"].downtime_hours / r["poll-and-restart"].preemptions > 0.5, nodes


def test_the_default_strategies_follow_the_layout_asked_for():
    assert list(by_name(plan(PlanInputs(nodes=3, **MULTI)))) == ["poll-and-restart", "polling", "respawn"]
    assert list(by_name(plan(PlanInputs(nodes=3, on_demand_nodes=1, min_nodes=2, **MULTI))))[-2:] == ["hybrid", "elastic"]
    with pytest.raises(ValueError, match="hybrid needs on_demand_nodes"):
        plan(PlanInputs(nodes=3, **MULTI), ("hybrid",))
    with pytest.raises(ValueError, match=r"elastic needs min_nodes below nodes \(3\), got 3"):
        plan(PlanInputs(nodes=3, **MULTI), ("elastic",))


def test_hybrid_is_interrupted_only_by_its_spot_nodes_and_costs_between_spot_and_on_demand():
    result = plan(PlanInputs(nodes=3, on_demand_nodes=1, **MULTI))
    r = by_name(result)
    assert per_training_hour(r["hybrid"]) == pytest.approx(2 / 3 * per_training_hour(r["respawn"]), rel=0.12)
    assert r["hybrid"].downtime_hours < r["respawn"].downtime_hours
    assert r["respawn"].cost < r["hybrid"].cost < result.on_demand_cost
    # All of them on demand: never interrupted, billed at the on-demand price for the time it trains.
    od = by_name(plan(PlanInputs(nodes=2, on_demand_nodes=2, **MULTI)))["hybrid"]
    assert od.preemptions == 0 and od.cost == pytest.approx(2 * od.wall_hours * PlanInputs().on_demand_price)


def test_elastic_keeps_training_while_slow_replacements_boot():
    slow = PlanInputs(nodes=4, min_nodes=3, boot_s=1800, **MULTI)
    r = by_name(plan(slow))
    assert r["elastic"].degraded_hours > 0 and r["respawn"].degraded_hours == 0
    assert r["elastic"].downtime_hours < r["respawn"].downtime_hours / 2
    assert r["elastic"].wall_hours < r["respawn"].wall_hours and r["elastic"].goodput > r["respawn"].goodput
    assert r["elastic"].cost < r["respawn"].cost  # the survivors train instead of billing idle


def test_elastic_pays_two_restarts_per_loss_so_fast_replacements_favour_waiting():
    # A replacement up in seconds: shrinking and growing the world costs more than waiting for it.
    fast = PlanInputs(nodes=4, min_nodes=3, boot_s=5, stockout_probability=0.0, restart_s=120, **MULTI)
    r = by_name(plan(fast))
    assert r["elastic"].wall_hours > r["respawn"].wall_hours


def test_elastic_with_min_nodes_equal_to_nodes_is_the_hybrid_model():
    # The two simulations are separate code; where their layouts coincide they must agree draw for draw.
    import random

    from respawn.app.plan import _simulate_elastic, _simulate_run

    p = PlanInputs(nodes=3, on_demand_nodes=1, **MULTI)
    rng_a, rng_b = random.Random(5), random.Random(5)
    a = [_simulate_run("hybrid", p, rng_a) for _ in range(50)]
    b = [_simulate_elastic(p, rng_b, 3) for _ in range(50)]
    for key in ("wall", "down", "redone", "ckpt", "preemptions", "cost"):
        assert [x[key] for x in a] == pytest.approx([y[key] for y in b], rel=1e-9), key


@pytest.mark.parametrize(
    "fields, message",
    [({"nodes": 0}, "nodes must be a whole number of at least 1"),
     ({"nodes": 2, "on_demand_nodes": 3}, r"on_demand_nodes must be a whole number within 0..nodes \(2\), got 3"),
     ({"nodes": 2, "min_nodes": 3}, r"min_nodes must be a whole number within 1..nodes \(2\), got 3"),
     ({"restart_s": -1}, "restart_s must not be negative"),
     ({"spare_nodes": -1}, "spare_nodes must be a whole number of at least 0, got -1"),
     ({"spare_nodes": 1.5}, "spare_nodes must be a whole number of at least 0, got 1.5"),
     ({"spare_join_s": -1}, "spare_join_s must not be negative")],
)
def test_bad_node_inputs_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        plan(PlanInputs(**{**FAST, **fields}))


def test_plan_command_plans_the_hybrid_and_elastic_layouts():
    r = plan_cli(["plan", "--runs", "30", "--json", "--nodes", "3", "--on-demand-nodes", "1", "--min-nodes", "2"])
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(body["strategies"]) == ["poll-and-restart", "polling", "respawn", "hybrid", "elastic"]
    assert (body["inputs"]["nodes"], body["inputs"]["on_demand_nodes"], body["inputs"]["min_nodes"]) == (3, 1, 2)
    assert body["strategies"]["elastic"]["degraded_hours"] > 0
    table = plan_cli(["plan", "--runs", "10", "--nodes", "3", "--min-nodes", "2"])
    assert table.returncode == 0 and "degraded h" in table.stdout and "3 nodes × 24 h" in table.stdout


@pytest.mark.parametrize(
    "args, message",
    [(["--nodes", "2", "--min-nodes", "3"], "--min-nodes 3 is more than --nodes (2)"),
     (["--nodes", "2", "--on-demand-nodes", "3"], "--on-demand-nodes 3 is more than --nodes (2)"),
     (["--nodes", "0"], "'--nodes'"),
     (["--set", "nodes=2.5"], "'2.5' is not a whole number"),
     (["--set", "min_nodes=4"], "min_nodes must be a whole number within 1..nodes (1), got 4"),
     (["--spare-nodes", "-1"], "'--spare-nodes'"),
     (["--set", "spare_nodes=-2"], "spare_nodes must be a whole number of at least 0, got -2")],
)
def test_plan_command_names_the_bad_node_option(args, message):
    r = plan_cli(["plan", "--runs", "5", *args])
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_longer_notice_saves_larger_states_and_only_the_strategies_that_wait_for_the_stop_wait_longer():
    from dataclasses import replace as with_

    base = PlanInputs(runs=60, state_gb=10.0)  # 10 GB does not fit the 25 s budget at 0.35 GB/s
    longer = with_(base, notice_s=120)
    assert max_emergency_state_gb(longer) == pytest.approx(max_emergency_state_gb(base) * (25 + 120) / 25)
    before, after = ({r.strategy: r for r in plan(p).results} for p in (base, longer))
    assert (before["respawn"].emergency_saved, after["respawn"].emergency_saved) == (0, 1)
    assert after["respawn"].redone_hours < before["respawn"].redone_hours
    # Respawn replaces the node during the notice: its recovery does not grow with it; a poller's waits for the stop.
    assert after["respawn"].downtime_hours == pytest.approx(before["respawn"].downtime_hours, rel=0.05)
    assert after["polling"].downtime_hours > before["polling"].downtime_hours
    with pytest.raises(ValueError, match="notice_s must be within 0..120"):
        plan(with_(base, notice_s=300))


# Warm spares (issue #25 item 5): K booted, set-up Spot nodes that take a lost member's place at once.
def test_spares_shorten_each_recovery_they_take_and_cost_k_spot_nodes_over_the_wall_time():
    p = PlanInputs(nodes=4, spare_nodes=1, **MULTI)
    result = plan(p)
    r, s = by_name(result), result.spares
    assert list(r)[-1] == "spares" and s.against == "respawn" and s.spare_nodes == 1
    # Common random numbers: the same member losses and redone work as respawn; only the recoveries differ.
    assert (r["spares"].preemptions, r["spares"].redone_hours) == (r["respawn"].preemptions, r["respawn"].redone_hours)
    assert r["spares"].downtime_hours < r["respawn"].downtime_hours / 2
    assert s.downtime_saved_hours == pytest.approx(r["respawn"].downtime_hours - r["spares"].downtime_hours)
    assert s.wall_saved_hours == pytest.approx(s.downtime_saved_hours)
    assert 0.5 < s.joined < 1  # one spare is sometimes not back yet (a boot, a stockout waited out in the zone)
    assert s.recovery_saved_s > 60
    # A spare slot bills Spot for the whole wall time; the spares are preempted too, at the members' per-node rate.
    assert s.cost == pytest.approx(1 * r["spares"].wall_hours * p.spot_price)
    assert s.spare_preemptions == pytest.approx(r["spares"].wall_hours / p.mtbp_hours, rel=0.15)
    assert s.net == pytest.approx(r["spares"].cost - r["respawn"].cost)
    assert s.recovery_cost_saved == pytest.approx(s.cost - s.net) and s.recovery_cost_saved > 0
    assert plan(PlanInputs(nodes=3, on_demand_nodes=1, spare_nodes=1, **MULTI)).spares.against == "hybrid"
    # Never preempted: the spares save nothing and the row costs theirs on top.
    calm = plan(PlanInputs(nodes=4, spare_nodes=2, **{**MULTI, "mtbp_hours": 1e9}))
    assert calm.spares.net == pytest.approx(calm.spares.cost) == pytest.approx(2 * 12.0 * p.spot_price, rel=0.01)
    assert calm.spares.recovery_saved_s == 0 and calm.spares.spare_preemptions == 0


def test_a_ready_spare_costs_only_the_join_the_handover_and_the_restore():
    import random

    from respawn.app.plan import recovery_s, _simulate_run, _spare_recovery_s

    p = PlanInputs(nodes=2, spare_nodes=1, **MULTI)
    rng = random.Random(1)
    assert _spare_recovery_s(p) == p.function_s + max(p.spare_join_s, 2.0 / (p.write_gbps * p.flush_vs_disk)) + 4.0
    assert _spare_recovery_s(p) < recovery_s("respawn", p, rng, False) - p.boot_s / 2
    runs = [_simulate_run("spares", p, rng) for _ in range(100)]
    all_taken = [r for r in runs if r["preemptions"] and r["joined"] == r["preemptions"]]
    assert len(all_taken) > 10
    for r in all_taken:
        assert r["down"] == pytest.approx(r["preemptions"] * _spare_recovery_s(p))
        # Every slot held all along (a spare steps in at once; the new VM boots as a spare): nodes + K, billed Spot.
        assert r["cost"] == pytest.approx((p.nodes + 1) * r["wall"] / 3600 * p.spot_price)
    # The zone stays dry for years: the lost slot's replacement never becomes a spare, so only the spare of the start
    # takes a loss; the others recover as respawn's do (one failed create, then elsewhere).
    dry = PlanInputs(**{**MULTI, "nodes": 2, "spare_nodes": 1, "stockout_probability": 1.0, "stockout_minutes": 1e7})
    never = [_simulate_run("spares", dry, rng) for _ in range(50)]
    assert max(r["joined"] for r in never) == 1 and any(r["preemptions"] > 1 for r in never)
    for r in never:
        recoveries = r["joined"] * _spare_recovery_s(dry) + (r["preemptions"] - r["joined"]) * recovery_s(
            "respawn", dry, random.Random(0), False) + (r["preemptions"] - r["joined"]) * dry.function_s
        assert r["down"] == pytest.approx(recoveries)


def test_no_spares_is_todays_model_draw_for_draw_and_spares_leave_the_other_rows_alone():
    import random
    from dataclasses import replace as with_

    from respawn.app.plan import _simulate_run

    for layout, against in ((dict(nodes=3), "respawn"), (dict(nodes=3, on_demand_nodes=1), "hybrid")):
        p = PlanInputs(**layout, **MULTI)
        rng_a, rng_b = random.Random(5), random.Random(5)
        a = [_simulate_run("spares", p, rng_a) for _ in range(50)]
        b = [_simulate_run(against, p, rng_b) for _ in range(50)]
        assert a == b, against
        without, with_spares = plan(p), plan(with_(p, spare_nodes=2))
        assert without.spares is None and "spares" not in without.to_json()
        rows = with_spares.to_json()["strategies"]
        assert rows.pop("spares") and rows == without.to_json()["strategies"]
    with pytest.raises(ValueError, match="spares needs spare_nodes of at least 1"):
        plan(PlanInputs(**MULTI), ("respawn", "spares"))


def test_plan_command_shows_what_spares_cost_and_save():
    r = plan_cli(["plan", "--runs", "30", "--json", "--nodes", "4",
                  "--spare-nodes", "1"])
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert body["inputs"]["spare_nodes"] == 1 and list(body["strategies"])[-1] == "spares"
    assert body["spares"]["against"] == "respawn" and body["spares"]["recovery_saved_s"] > 0
    assert body["spares"]["cost"] == pytest.approx(body["strategies"]["spares"]["wall_hours"] * 1.47, rel=1e-3)
    table = plan_cli(["plan", "--runs", "10", "--spare-nodes", "2"])
    assert table.returncode == 0, table.stderr
    assert "spares: 2 warm" in table.stdout and "spares: 2 Spot nodes all along: +$" in table.stdout
    assert "min per loss" in table.stdout and "against respawn" in table.stdout
    plain = plan_cli(["plan", "--runs", "10"])
    assert "spares" not in plain.stdout


def test_the_provisioning_comparison_without_droughts_is_the_same_run_for_every_spot_policy():
    from respawn.app.plan_tiers import POLICIES

    rows = {t.policy: t for t in plan(PlanInputs(runs=60, spot_dry_probability=0.0)).provisioning}
    assert list(rows) == list(POLICIES)
    spot = rows["spot"]
    for name in ("spot-flex-start", "spot-on-demand"):  # common random numbers: nothing moves, nothing differs
        assert (rows[name].wall_hours, rows[name].cost, rows[name].flex_start_hours, rows[name].on_demand_hours) == (
            spot.wall_hours, spot.cost, 0.0, 0.0)
    assert spot.droughts == 0 and spot.preemptions > 0
    on_demand = rows["on-demand"]
    assert on_demand.preemptions == 0 and on_demand.spot_hours == 0
    assert on_demand.cost == pytest.approx(on_demand.on_demand_hours * 3.67)


def test_in_long_droughts_flex_start_finishes_like_on_demand_for_less():
    p = PlanInputs(runs=200, mtbp_hours=3, spot_dry_probability=0.5, spot_dry_hours=8)
    rows = {t.policy: t for t in plan(p).provisioning}
    spot, flex, od = rows["spot"], rows["spot-flex-start"], rows["spot-on-demand"]
    assert spot.p90_wall_hours > 2 * flex.p90_wall_hours  # all-Spot waits the droughts out
    assert flex.p90_wall_hours < od.p90_wall_hours + 1  # the flex-start wait and its runs' ends cost little time
    assert flex.cost < od.cost < rows["on-demand"].cost
    assert flex.flex_start_hours > flex.spot_hours and od.on_demand_hours > od.spot_hours
    # A short run duration ends more flex-start lives: more saves and boots, the job still finishes.
    short = {t.policy: t for t in plan(replace(p, flex_run_hours=1)).provisioning}["spot-flex-start"]
    assert short.wall_hours > flex.wall_hours and short.flex_start_hours > 0


@pytest.mark.parametrize("setting, message", [
    ({"flex_run_hours": 200}, "flex_run_hours must be within 10 min..168 h"),
    ({"spot_dry_probability": 1.5}, "spot_dry_probability must be within 0..1"),
    ({"flex_run_hours": 0.17, "state_gb": 300}, "leaves no time to train"),
])
def test_provisioning_inputs_are_checked(setting, message):
    with pytest.raises(ValueError, match=message):
        plan(PlanInputs(runs=5, **setting))


def test_the_cli_prints_the_provisioning_comparison():
    r = plan_cli(["plan", "--runs", "20", "--json"])
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["provisioning"]
    assert list(rows) == ["spot", "spot-flex-start", "spot-on-demand", "on-demand"]
    assert {"wall_hours", "p90_wall_hours", "cost", "flex_start_hours"} <= set(rows["spot-flex-start"])
    table = plan_cli(["plan", "--runs", "20", "--set", "spot_dry_probability=0.6",
                      "--set", "spot_dry_hours=10"])
    assert "ways of getting capacity" in table.stdout and "surest finish (p90)" in table.stdout


def test_the_plan_says_the_share_saved_against_on_demand_as_the_report_page_does():
    # "Saved against on demand" is 1 − cost ÷ on demand on every page (docs/watching.md): the plan's column too, not the
    # cost ratio (which read 41 % where the report page would say 59 % saved).
    body = json.loads(plan_cli(["plan", "--runs", "10", "--json"]).stdout)
    table = plan_cli(["plan", "--runs", "10"], env={**os.environ, "COLUMNS": "250"})
    assert table.returncode == 0, table.stderr
    assert "saved vs on-demand" in table.stdout
    [row] = [line for line in table.stdout.splitlines() if line.startswith("│ respawn ")]
    saved = 1 - body["strategies"]["respawn"]["cost"] / body["on_demand_cost"]
    assert row.split("│")[-2].strip() == f"{saved:.0%}" and saved > 0.5


def test_plan_reads_a_job_spec_and_the_options_given_override_it():
    # examples/jobs/hybrid-ddp.yaml: 3 g2-standard-24 nodes in us-central1 zones, 1 on demand, training on 2 or more.
    from respawn import prices, schema

    job = Path(__file__).resolve().parent.parent / "examples" / "jobs" / "hybrid-ddp.yaml"
    r = plan_cli(["plan", str(job), "--runs", "5", "--json"])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["inputs"]
    acc = schema.GpuAccelerator(kind="gpu", machine_type="g2-standard-24")
    rate = prices.quote(acc, prices.offline("us-central1")).rates["spot"]
    assert (got["nodes"], got["on_demand_nodes"], got["min_nodes"]) == (3, 1, 2)
    assert (got["spot_price"], got["on_demand_price"]) == (rate.usd_per_hour, rate.on_demand_usd_per_hour)
    assert f"spot ${rate.usd_per_hour:.4g}/h, on demand ${rate.on_demand_usd_per_hour:.4g}/h a node (offline table" in (
        r.stderr)
    # An option given on the command line wins, and the plan says which.
    r = plan_cli(["plan", str(job), "--runs", "5", "--json", "--nodes", "4",
                  "--spot-price", "1"])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["inputs"]
    assert (got["nodes"], got["on_demand_nodes"], got["spot_price"]) == (4, 1, 1.0)
    assert "overridden by the options given: nodes, spot_price" in r.stderr
