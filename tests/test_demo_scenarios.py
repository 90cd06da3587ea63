"""`respawn demo` end to end: every example scenario runs the real emulators, sim, functions, agents and trainers,
and its summary must show the right outcome, one live node at a time, and no lost work where the emergency
checkpoint fits the notice. Nothing the demo started may outlive it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from sim.demo.scenario import default_scenario, parse_scenario
from test_demo_summary import assert_each_line_rises

SCENARIOS = Path(__file__).resolve().parent.parent / "examples" / "scenarios"


def leftovers(token: str) -> list[int]:
    marker = f"RESPAWN_DEMO_TEST={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    token = uuid.uuid4().hex
    env = {**os.environ, "RESPAWN_DEMO_TEST": token}
    r = subprocess.run([sys.executable, "-m", "respawn", "demo", "--json", "--no-live", "--out", str(tmp_path / "out"), *args],
                       capture_output=True, text=True, env=env, timeout=600)
    assert leftovers(token) == [], "processes the demo started are still running"
    assert r.stdout.strip(), f"no summary; stderr:\n{r.stderr[-4000:]}"
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def check_common(r, out, tmp_path):
    assert r.returncode == 0, f"ended {out['state']}, expected {out['expected_state']}:\n{r.stderr[-4000:]}"
    assert out["state"] == out["expected_state"]
    page = (tmp_path / "out" / "timeline.html").read_text()
    assert page.startswith("<!doctype html>")
    if out["final_step"]:
        assert_each_line_rises(page)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["state"] == out["state"]
    if out["state"] == "SUCCEEDED":
        assert out["max_live_nodes"] == 1
        assert out["final_step"] == out["total_steps"]
        assert any(a.startswith(f"Job {out['job_id']} succeeded") for a in out["alerts"])
        assert 0 < out["goodput"] <= 1


def test_default_scenario(tmp_path):
    r, out = run_demo(tmp_path)
    check_common(r, out, tmp_path)
    assert out["restarts"] == 2 and out["lost_steps"] == 0
    # The first zone stocked out after the first preemption: the job moved down its list.
    assert out["zones"][:2] == ["us-central1-a", "us-central1-b"]
    assert sum("recovered" in a for a in out["alerts"]) == 2
    # The real path: every node booted deploy/vm/startup.sh, which fetched the agent from the storage emulator; the
    # agent fetched the packed examples/workdir from it and ran the setup command and the trainer on the spec's
    # interpreter; the restart in place (the second preemption) reused both and skipped setup.
    logs = {p.name.split(".")[0]: [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
            for p in (tmp_path / "out" / "nodes").rglob("*.console.log")}
    assert len(logs) == 2, sorted(logs)
    for node, lines in logs.items():
        fetches = [e for e in lines if e.get("stage") == "agent_fetch"]
        assert fetches[0]["downloaded"] is True and fetches[0]["uri"].startswith("gs://respawn-demo/"), node
        stages = [e for e in lines if e["message"] == "prepare stage"]
        downloads = [e for e in stages if e["stage"] == "workdir_download"]
        assert len(downloads) == 1 and downloads[0]["uri"].startswith("gs://respawn-demo/respawn/workdirs/sha256-")
        [setup] = [e for e in stages if e["stage"] == "setup_command"]
        assert setup["argv"] == [sys.executable, "prepare.py", "--framework", "torch"] and setup["exit_code"] == 0
    boots = {node: [e["downloaded"] for e in lines if e.get("stage") == "agent_fetch"] for node, lines in logs.items()}
    assert sorted(boots.values()) == [[True], [True, False]], boots
    restarted = next(logs[node] for node, fetched in boots.items() if len(fetched) == 2)
    assert any(e.get("stage") == "workdir_reuse" for e in restarted)
    assert any(e.get("stage") == "setup" and e.get("skipped") for e in restarted)


def test_default_scenario_file_matches_the_built_in_default():
    assert parse_scenario(yaml.safe_load((SCENARIOS / "default.yaml").read_text())) == default_scenario()


@pytest.mark.parametrize("name", ["duplicate-events", "dropped-event", "all-zones-stocked-out", "tpu", "jax",
                                  "invalid-spec", "large-state", "flaky-apis", "setup-fails", "ddp-8"])
def test_scenario(tmp_path, name):
    sc = parse_scenario(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))
    r, out = run_demo(tmp_path, "--scenario", str(SCENARIOS / f"{name}.yaml"))
    check_common(r, out, tmp_path)
    states = [t["to"] for t in out["transitions"]]
    with_notice = [p for p in sc.preemptions if p.kind == "preempted"]
    if name == "invalid-spec":
        assert states[-1] == "INVALID" and out["max_live_nodes"] == 0
        assert any("invalid spec" in a and "zones" in a for a in out["alerts"])
    elif name == "ddp-8":
        # Every notice stopped all eight ranks after one agreed step, which then resumed: nothing lost.
        assert out["lost_steps"] == 0
        stops = re.findall(r"torch_ddp\[rank (\d+)\]: preempted at step (\d+)", "".join(
            p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log")))
        by_step: dict[str, set[str]] = {}
        for rank, step in stops:
            by_step.setdefault(step, set()).add(rank)
        assert len(by_step) == len(with_notice) and all(ranks == {str(r) for r in range(8)}
                                                         for ranks in by_step.values()), by_step
    elif name == "setup-fails":
        # Not a preemption: FAILED at the first failure, the command and its output named, no node made again.
        command = "-m pip install --no-index --quiet torch==9.9"
        assert states == ["PENDING", "PROVISIONING", "RUNNING", "FAILED"] and out["restarts"] == 0
        assert out["transitions"][-1]["cause"] == "setup_failed" and command in out["message"]
        details = out["transitions"][-1]["details"]
        assert details["failed_command"][1:] == command.split() and details["exit_code"] == 1
        assert "torch==9.9" in details["output_tail"]  # pip's own words: no version satisfies it
        assert [a for a in out["alerts"] if a.startswith(f"Job {out['job_id']} failed") and command in a]
    elif name == "large-state":
        # The emergency save cannot fit the budget: the job resumes from a periodic checkpoint and redoes steps.
        assert 0 < out["lost_steps"]
    elif name == "jax":
        # The host error gives no notice: at most the steps since the last periodic checkpoint are redone.
        assert 0 <= out["lost_steps"] <= 2 * sc.trainer.checkpoint_every
    else:
        assert out["lost_steps"] == 0
    if name not in ("invalid-spec", "setup-fails"):
        assert out["restarts"] == len(sc.preemptions) >= len(with_notice)
    if name == "all-zones-stocked-out":
        assert "WAITING_FOR_CAPACITY" in states
    if name == "dropped-event":
        # No audit event arrived: the sweep found the node gone (a cause other than the event's "preempted").
        assert "preempted" not in [t["cause"] for t in out["transitions"]]
