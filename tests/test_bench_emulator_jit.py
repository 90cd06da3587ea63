"""Smoke test of `python -m bench.emulator_jit`: both variants run the workload on a live emulator, the second with
the harness's JIT options; the figures are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sim.emulators import JVM_OPTIONS

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_measures_the_defaults_against_the_harness_options():
    proc = subprocess.run([sys.executable, "-m", "bench.emulator_jit", "--quick", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"bench.emulator_jit failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout)
    assert [r["jvm_options"] for r in result["rows"]] == ["(the JVM's defaults)", JVM_OPTIONS]
    assert all(r["cpu_s"] > 0 and r["workload_s"] > 0 for r in result["rows"]), result
    assert result["writes"] == 100 and result["cpu_ratio"] > 0
