"""bench/checkpoint.py --ranks 2 at smoke size: two spawned gloo ranks, FSDP2-sharded state, every figure a finite
number (no timing asserts), and it cleans up. One run serves both tests (a module fixture): the table renders from
the same result the CLI prints as JSON (checkpoint_distributed.table, which the CLI prints without --json)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.checkpoint_distributed import table

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoint-distributed")
    r = subprocess.run([sys.executable, "-m", "bench.checkpoint", "--ranks", "2", "--quick", "--json",
                        "--dir", str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), folder


def test_two_rank_quick_run_reports_every_figure(quick_run):
    out, folder = quick_run
    assert out["ranks"] == 2 and out["backend"] == "gloo"
    for key in ("size_mb", "checkpoint_mb", "raw_write_MBps", "dcp_save_s", "dcp_async_block_s", "stall_first_s",
                "stall_s", "stall_ratio", "dcp_async_ratio", "stall_vs_dcp_async", "periodic_total_s",
                "emergency_s", "emergency_MBps", "flush_vs_disk"):
        assert isinstance(out[key], (int, float)) and math.isfinite(out[key]) and out[key] > 0, key
    for key in ("raw_write_runs_MBps", "dcp_save_runs_s", "dcp_async_runs_s", "emergency_runs_MBps",
                "flush_vs_disk_pairs"):
        assert out[key] and all(math.isfinite(x) and x > 0 for x in out[key]), key
    assert len(out["flush_vs_disk_pairs"]) == 2
    assert set(out["goals"]) == {"stall_ratio", "stall_vs_dcp_async", "flush_vs_disk"}
    assert set(out["goals"].values()) <= {"PASS", "MISS"}
    assert not [p for p in folder.iterdir() if p.name.startswith("respawn-bench-")]  # it cleans up


def test_two_rank_table_compares_with_the_goals(quick_run):
    text = table(quick_run[0])
    for row in ("blocking dcp.save", "dcp.async_save", "stall_ratio (goal <= 0.10)", "flush_vs_disk (goal >= 0.85)"):
        assert row in text, row
    assert "PASS" in text or "MISS" in text
