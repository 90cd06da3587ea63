"""Smoke test of `python -m bench.coldstart`: it runs, both variants really recover a preempted job in their cold
child, and the respawn function's import loads no Google client while the naive baseline's does. The figures
themselves are never asserted (benchmarks print them; the machine is shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from bench.coldstart import EVENTS, METRICS, VARIANTS, table

ROOT = Path(__file__).resolve().parent.parent
TOP = [f"{v}_{k}" for v in VARIANTS for k in ("import_s", "first_event_s", "total_s", "rss_after_import_mib",
                                                "peak_rss_mib")]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_quick_run_reports_every_figure_and_really_recovers(firestore_emulator):
    # The session's Firestore emulator (the bench empties only its own project, respawn-bench).
    proc = subprocess.run([sys.executable, "-m", "bench.coldstart", "--quick", "--json", "--firestore", firestore_emulator],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"bench.coldstart failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout)
    assert "repeat 1/1: respawn preemption ..." in proc.stderr  # progress goes to stderr, the JSON alone to stdout

    for key in TOP:
        assert _positive(result.get(key)), f"{key} = {result.get(key)!r}"
    for event in EVENTS:
        for variant in VARIANTS:
            figures = result["events"][event][variant]
            for metric in METRICS + ("process_s",):
                s = figures[metric]
                assert all(_positive(s[k]) for k in ("median", "min", "max")), f"{event}/{variant}/{metric}: {s}"
                assert len(s["runs"]) == result["repeats"] == 1
        for metric in METRICS:
            assert _positive(result["ratios"][event][metric])

    # The recovery path ran to the end in each variant's cold process (checked in Firestore and the sim).
    assert result["respawn_recovered"] is True and result["naive_recovered"] is True
    assert all(result["events"]["preemption"][v]["recovered"] is True for v in VARIANTS)
    assert all(result["events"]["foreign"][v]["acknowledged"] is True for v in VARIANTS)

    # Only the import strategy differs: respawn's import loads no client, the naive one loads them eagerly.
    assert result["respawn_compute_v1_at_import"] is False and result["naive_compute_v1_at_import"] is True
    for event in EVENTS:
        respawn, naive = result["events"][event]["respawn"], result["events"][event]["naive"]
        assert not any(respawn["modules_at_import"].values()), respawn["modules_at_import"]
        assert naive["modules_at_import"]["google.cloud.compute_v1"] and naive["modules_at_import"]["google.cloud.firestore"]
    # The recovery loads the clients on first use; the foreign entry is acknowledged without any.
    assert result["events"]["preemption"]["respawn"]["modules_after_event"]["google.cloud.compute_v1"] is True
    assert not any(result["events"]["foreign"]["respawn"]["modules_after_event"].values())

    # The human-readable form renders every row from the same result.
    lines = table(result).splitlines()
    for event in EVENTS:
        for variant in list(VARIANTS) + ["naive/respawn"]:
            assert any(line.split()[:2] == [variant, event] for line in lines if line.strip()), (variant, event)
