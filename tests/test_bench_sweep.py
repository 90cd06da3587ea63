"""bench/sweep.py at smoke size: it runs end to end and its figures say what matters (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.sweep import _mix

ROOT = Path(__file__).resolve().parent.parent


def test_the_mix_has_every_kind_of_job_and_each_job_once():
    for jobs in (3, 30, 2000):
        mix = _mix(jobs)
        ids = [j for kind in ("running", "preempted", "waiting") for j in mix[kind]]
        assert len(ids) == len(set(ids)) == jobs and all(mix[kind] for kind in mix)
    assert {k: len(v) for k, v in _mix(2000).items()} == {"running": 1200, "preempted": 600, "waiting": 200}


def test_quick_run_reconciles_every_job_and_none_waits_on_the_hung_operation():
    r = subprocess.run([sys.executable, "-m", "bench.sweep", "--quick", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    fan, serial = out["fanned_out"], out["serial"]
    assert out["jobs"] == 11 and out["mix"] == {"running": 6, "preempted": 4, "waiting": 1}
    # Every job reconciled once by each sweep, and left as it should be (bench.sweep.check raised otherwise).
    assert fan["reconciled"] == serial["reconciled"] == 11
    assert fan["outcome"] == serial["outcome"] == {"running": 10, "waiting": 1}
    assert fan["published"] == fan["deliveries"] == 11  # one message per active job, each delivered once
    # Fanned out, every other job is reconciled while a-slow's operation hangs; in turn, none is (a-slow is first).
    assert fan["before_slow_ended"] == 10 and serial["before_slow_ended"] == 0
    assert serial["others_seconds"] >= serial["slow_ended_seconds"] > 0
    assert "fanned out: every job but a-slow reconciled" in r.stderr  # progress is shown
