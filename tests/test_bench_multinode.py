"""bench/multinode.py at smoke size: both recoveries run end to end and the VM counts say what each did (no timing
asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_two_node_run_replaces_one_vm_where_the_relaunch_makes_every_vm_again():
    r = subprocess.run([sys.executable, "-m", "bench.multinode", "--nodes", "2", "--scale", "0.01", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [row] = json.loads(r.stdout)["rows"]
    assert row["nodes"] == 2
    assert (row["respawn_vms_created"], row["relaunch_vms_created"]) == (1, 2)
    assert row["respawn_s"] > 0 and row["relaunch_s"] > 0


def test_bad_arguments_are_refused_with_the_reason():
    r = subprocess.run([sys.executable, "-m", "bench.multinode", "--nodes", "1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "each job size must be 2..64" in r.stderr
