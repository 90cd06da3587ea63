"""bench.recovery at CI size (--quick: N = 2): the figures' shape and what they say about behaviour (every
variant recovered, one VM made per lost member against N for the relaunch, a warm spare trains before any new VM),
never a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_run_reports_every_variant_recovered_with_the_vms_each_made():
    out = subprocess.run([sys.executable, "-m", "bench.recovery", "--quick", "--json"], cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(r["restore_vs_raw_read"]) == {"local", "gcs"} and r["unpack_mbps"] > 0
    seen = {(row["variant"], row["nodes"]) for row in r["rows"]}
    variants = {"seeds", "relaunch", "respawn", "+notice", "+cache", "+restore", "+spares", "all"}
    assert seen == {(v, 2) for v in variants | {"+in-process"}}
    for row in r["rows"]:
        key = f"{row['variant']}@{row['nodes']}"
        assert r["notice_to_step_seconds"][key] == row["notice_to_step_seconds"] > 0, key
        made = {"seeds": 0, "relaunch": row["nodes"]}.get(row["variant"], 1)  # the seeds start the same VM again
        assert row["vms_created"] == made, key
        if row["variant"] in ("+spares", "all"):  # the spare took the lost member's place: no new VM waited for
            assert row["last"] in ("spare", "survivor") and "create" not in row["stages"], key
    assert set(r["all_vs_relaunch"]) == {"2"}
