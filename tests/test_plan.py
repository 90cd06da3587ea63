"""The goodput planner: the simulation's behaviour, and the `respawn plan` command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from respawn.plan import PlanInputs, max_emergency_state_gb, plan, with_bench

FAST = dict(job_hours=12.0, runs=150, seed=7)


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
    r = subprocess.run(
        [sys.executable, "-m", "respawn", "plan", "--runs", "40", "--json", "--plot", str(chart), "--set", "state_gb=3"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(body["strategies"]) == {"poll-and-restart", "polling", "respawn"}
    assert body["inputs"]["state_gb"] == 3.0
    svg = chart.read_text()
    assert svg.startswith("<svg") and all(name in svg for name in ("poll-and-restart", "polling", "respawn"))


def test_plan_command_rejects_unknown_settings():
    r = subprocess.run([sys.executable, "-m", "respawn", "plan", "--set", "mtpb=3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected NAME=VALUE with NAME one of" in r.stderr and "Traceback" not in r.stderr
