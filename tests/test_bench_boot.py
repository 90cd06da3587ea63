"""Smoke test of `python -m bench.boot`: it runs, a fresh node and a restart in place really boot through the real
startup script to the trainer's first step, every stage of both is observed where it should be, and the baseline
(the old pip-install-at-boot startup script) really installs. The figures themselves are never asserted
(benchmarks print them; the machine is shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from bench.boot import BASELINE_STAGES, KINDS, STAGES, SUMS, table

ROOT = Path(__file__).resolve().parent.parent


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def test_quick_run_boots_fresh_and_in_place_and_observes_every_stage(firestore_emulator):
    proc = subprocess.run([sys.executable, "-m", "bench.boot", "--quick", "--repeats", "1", "--json",
                           "--firestore", firestore_emulator],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"bench.boot failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout)  # the JSON alone on stdout, progress on stderr
    assert "repeat 1/1: fresh node booting ..." in proc.stderr
    assert result["repeats"] == 1 and result["warmup"] == 0

    for kind in KINDS:
        figures = result["stages"][kind]
        assert set(figures) == set(STAGES + SUMS)
        for name, s in figures.items():
            assert all(_number(s[k]) for k in ("median", "min", "max")) and len(s["runs"]) == 1, (kind, name, s)
            assert s["median"] >= -0.05, (kind, name, s)  # derived stages: clock rounding only
        assert figures["total_s"]["median"] > 0 and figures["respawn_s"]["median"] > 0
    # Every stage happened where it should: a fresh node downloads and installs everything, a restart in place
    # reuses it and uploads what its previous life left on the disk.
    assert {"agent_fetch", "startup_total", "workdir_download", "workdir_unpack", "library_download",
            "library_install", "setup_command", "setup", "preparation", "trainer_spawn", "restore",
            "first_step"} <= set(result["observed"]["fresh"])
    assert {"agent_fetch", "workdir_reuse", "previous_life_upload", "preparation", "trainer_spawn", "restore",
            "first_step"} <= set(result["observed"]["in_place"])
    assert {"library_install", "setup"} <= set(result["skipped"]["in_place"])
    assert result["fresh_downloaded_bytes"] > 0 and result["in_place_downloaded_bytes"] == 0
    # The power-off between them was a preemption: emergency checkpoint (exit 75), final heartbeat, restored.
    assert result["fresh_emergency_exit_codes"] == [75] and result["fresh_final_heartbeats_written"] is True
    assert result["in_place_restored_steps"][0] is not None
    assert "respawn" not in result["image_packages"] and "torch" in result["image_packages"]

    for kind in KINDS:
        assert set(result["baseline"][kind]) == set(BASELINE_STAGES + ("total_s",))
        assert result["baseline"][kind]["total_s"]["median"] > 0
    assert result["baseline"]["fresh"]["venv"]["median"] > 0 and result["baseline"]["fresh"]["pip_install"]["median"] > 0
    assert result["baseline_installed_distributions"] > 1  # respawn and what the image lacks
    for kind in KINDS:
        assert {"limit_s", "respawn_s", "pass"} <= set(result["goals"][kind])
        assert isinstance(result["goals"][kind]["pass"], bool)
    assert _number(result["disk_write_mib_s"]["median"]) and result["disk_write_mib_s"]["median"] > 0

    # The human-readable form renders from the same result.
    text = table(result)
    for line in ("Respawn's share", "goal in place:", "goal fresh:", "pip at boot: total", *STAGES):
        assert line in text, line
