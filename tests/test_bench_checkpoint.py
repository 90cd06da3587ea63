"""bench/checkpoint.py at smoke size, and its figures feeding `respawn plan --bench-json` (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_reports_every_figure_and_the_plan_takes_them(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.checkpoint", "--quick", "--json", "--repeats", "2",
                        "--dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["size_mb"] == 64
    for key in ("raw_write_MBps", "stall_s", "stall_ratio", "flush_vs_disk", "restore_seconds", "emergency_s"):
        assert isinstance(out[key], (int, float)) and out[key] > 0, key
    assert len(out["flush_vs_disk_pairs"]) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("respawn-bench-")]  # it cleans up

    figures = tmp_path / "ckpt.json"
    figures.write_text(r.stdout)
    p = subprocess.run([sys.executable, "-m", "respawn", "plan", "--runs", "20", "--json", "--bench-json", str(figures)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    inputs = json.loads(p.stdout.strip().splitlines()[-1])["inputs"]
    assert inputs["stall_ratio"] == out["stall_ratio"] and inputs["flush_vs_disk"] == min(out["flush_vs_disk"], 1.0)
    assert inputs["write_gbps"] == out["raw_write_MBps"] / 1000


def test_plan_rejects_a_file_that_is_no_benchmark_output(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text('{"hello": 1}\n')
    p = subprocess.run([sys.executable, "-m", "respawn", "plan", "--runs", "20", "--bench-json", str(bogus)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "not the --json output of bench.checkpoint or bench.controller" in p.stderr + p.stdout
