"""bench/controller.py at smoke size: it runs end to end and its figures say what matters (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.controller import STORM_ZONES, percentile

ROOT = Path(__file__).resolve().parent.parent


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0


def test_quick_run_recovers_the_storm_without_double_provisioning(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.controller", "--quick", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    for key in ("p50_ms", "p99_ms", "reads_per_recovery", "writes_per_recovery", "storm_seconds", "storm_recovered",
                "double_provisioned"):
        assert key in out, key
    assert 0 < out["p50_ms"] <= out["p99_ms"]
    # Every recovery reads the job and writes its status at least once.
    assert out["reads_per_recovery"] >= 1 and out["writes_per_recovery"] >= 1
    # 10 jobs preempted in zone a, which then has no room; b has room for 6, c for 5: all 10 recovered, in b and c.
    assert out["storm_jobs"] == 10 and out["storm_recovered"] == 10
    assert out["double_provisioned"] == 0
    assert out["storm_seconds"] is not None and out["storm_seconds"] > 0
    zones = out["storm_zones"]
    assert sum(zones.values()) == 10 and STORM_ZONES[0] not in zones
    assert zones.get(STORM_ZONES[1], 0) <= 6 and zones.get(STORM_ZONES[2], 0) <= 5
    # The seeds' function retries the same zone only: nothing comes back, and it says so.
    base = out["baseline"]
    assert base["storm_recovered"] == 0 and base["storm_seconds"] is None
    assert base["storm_failed_deliveries"] == base["storm_deliveries"] >= 10
    assert "storm (Respawn)" in r.stderr  # progress is shown

    # respawn plan takes the controller's time per event from this output.
    figures = tmp_path / "ctl.json"
    figures.write_text(r.stdout)
    p = subprocess.run([sys.executable, "-m", "respawn", "plan", "--runs", "20", "--json", "--bench-json", str(figures)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["inputs"]["function_s"] == out["p50_ms"] / 1000
