"""The framework integrations' benchmarks (bench/framework_*.py) at smoke size: each runs its integration beside the
framework's own save in one process and reports both sides; a figure is checked for what it says (present, a
measured time, a ratio of the two), never for a speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RUNS = {  # the benchmark, its smallest sizes, the figures that compare the integration with the framework alone
    "framework_transformers": (["--steps", "12", "--every", "4", "--step-ms", "5", "--state-mb", "4"],
                               ["respawn_us_between_saves", "trainer_save_ms", "respawn_stall_ms", "stall_ratio"]),
    "framework_lightning": (["--steps", "12", "--every", "4", "--step-ms", "5", "--state-mb", "4"],
                            ["respawn_us_between_saves", "lightning_save_ms", "respawn_stall_ms", "stall_ratio"]),
    "framework_accelerate": (["--quick", "--steps", "50", "--repeats", "1", "--saves", "2"],
                             ["step_respawn_us", "save_state_fsync_s", "stall_s", "stall_ratio", "emergency_s"]),
    "framework_orbax": (["--mb", "2", "--steps", "12", "--every", "4", "--step-ms", "5"],
                        ["step_us_respawn", "blocking_s", "stall_s_respawn", "stall_ratio", "commit_s"]),
}


@pytest.mark.parametrize("bench", sorted(RUNS))
def test_a_framework_benchmark_reports_its_integration_against_the_framework(bench, tmp_path):
    args, figures = RUNS[bench]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", f"bench.{bench}", *args, "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for name in figures:
        assert isinstance(out[name], (int, float)) and out[name] >= 0, (name, out)
    assert out["stall_ratio"] > 0, out  # both sides measured
