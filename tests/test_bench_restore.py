"""bench/restore.py at smoke size: every figure present, both stores read the same bytes, the restored tensors equal
the saved ones (no timing asserts)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_reports_raw_read_and_restore_for_both_stores(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.restore", "--quick", "--json", "--dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["size_mb"] == 64 and out["same_bytes"] is True and out["cache"] in ("dropped", "warm")
    assert out["local"]["bytes"] == out["gcs"]["bytes"] > 64 << 20  # the data files and the skeleton, both reads
    for store in ("local", "gcs"):
        for key in ("raw_read_s", "raw_read_MBps", "restore_s", "restore_MBps", "restore_vs_raw_read",
                    "restore_fresh_MBps"):
            value = out[store][key]
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (store, key)
        assert out["restore_vs_raw_read"][store] == out[store]["restore_vs_raw_read"]
    assert out["gcs"]["raw_client_MBps"] > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("respawn-bench-")]  # it cleans up
