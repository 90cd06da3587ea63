"""`respawn demo` on a bad day (issue 46 items 3 and 5), end to end with the real emulators, sim, functions, agents
and trainers: a run interrupted by Ctrl-C still writes its summary, report and logs and says where; a run that
misses its scenario's preemptions is not a success; two runs started at once from one folder each take an output
folder of their own and succeed on their own files. The checks of the end (`_unexpected`) are a table. (Once a
`--keep` run has ended, the CLI pointed at its stopped emulators says so within seconds: test_demo_pages_agree.py,
on its kept demo.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from test_demo_scenarios import SCENARIOS, leftovers, project_left, session_emulators  # noqa: F401 - fixture
import test_demo_scenarios


def demo_argv(tmp_path: Path, scenario: dict | Path, *args: str) -> tuple[list[str], dict[str, str], str]:
    """The demo on this worker's emulators, under a project of its own, with a token its processes inherit."""
    if isinstance(scenario, dict):
        path = tmp_path / f"{scenario['name']}-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(scenario))
        scenario = path
    token = uuid.uuid4().hex
    firestore_host, pubsub_host = test_demo_scenarios._session_emulators()
    argv = [sys.executable, "-m", "respawn", "demo", "--json", "--no-live", "--scenario", str(scenario),
            "--firestore-emulator", firestore_host, "--pubsub-emulator", pubsub_host,
            "--project", f"demo-test-{token[:12]}", *args]
    return argv, {**os.environ, "RESPAWN_DEMO_TEST": token}, token


def finished(argv: list[str], env: dict[str, str], token: str, proc: subprocess.Popen | None = None,
             stderr: Path | None = None) -> tuple[int, dict, str]:
    """The run's exit code, its summary (the last stdout line) and its stderr, once nothing it started runs."""
    if proc is None:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        code, stdout, said = r.returncode, r.stdout, r.stderr
    else:
        stdout = proc.communicate(timeout=600)[0]
        code, said = proc.returncode, stderr.read_text()
    assert leftovers(token) == [], "processes the demo started are still running"
    firestore_host, pubsub_host = test_demo_scenarios._session_emulators()
    assert project_left(firestore_host, pubsub_host, argv[argv.index("--project") + 1]) == []
    assert "Traceback" not in said, said[-4000:]
    assert stdout.strip(), f"no summary; stderr:\n{said[-4000:]}"
    return code, json.loads(stdout.strip().splitlines()[-1]), said


def assert_record(out_dir: Path, summary: dict) -> None:
    """What a run leaves, whatever its end: the summary as printed, the report page, every node's logs."""
    assert json.loads((out_dir / "summary.json").read_text()) == summary
    assert summary["summary"] == str(out_dir / "summary.json")
    assert summary["report"] == str(out_dir / "report.html")
    assert (out_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html>")
    assert not (out_dir / "timeline.html").exists()  # retired: the report page is the one page
    assert summary["logs"][-1] == f"in {out_dir / 'logs.txt'}"
    assert "step" in (out_dir / "logs.txt").read_text(), "the trainer's own lines are not in logs.txt"


def test_ctrl_c_mid_run_keeps_the_record_and_says_where(tmp_path):
    """Ctrl-C while the job trains (a minute of steps): the demo stops everything it started, and the summary,
    report and logs of what ran are written; its last line says where, and it exits 130."""
    sc = {"name": "interrupted", "trainer": {"steps": 600, "step_seconds": 0.1, "checkpoint_every": 50}}
    argv, env, token = demo_argv(tmp_path, sc, "--out", str(tmp_path / "out"))
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as f:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=f, text=True, env=env)
    said, deadline = "", time.monotonic() + 600

    def trained() -> int:  # the furthest step the live view's plain lines have shown
        return max(map(int, re.findall(r"step=(\d+)/", said)), default=0)

    while trained() < 150 and proc.poll() is None and time.monotonic() < deadline:  # a checkpoint and logs shipped
        time.sleep(0.2)
        said = stderr.read_text()
    assert trained() >= 150, said[-4000:]
    proc.send_signal(signal.SIGINT)  # as Ctrl-C does (the emulators and nodes run in sessions of their own)
    code, out, said = finished(argv, env, token, proc, stderr)
    assert code == 130, said[-4000:]
    assert out["interrupted"] is True and out["state"] == "RUNNING", out["state"]
    assert 150 <= out["final_step"] < 600
    assert_record(tmp_path / "out", out)
    last = said.strip().splitlines()[-1]
    assert last.startswith("error: demo interrupted at ") and "(the job RUNNING)" in last, last
    assert last.endswith(f"everything it started has been stopped; what it ran is recorded in {tmp_path / 'out'} "
                         "(summary.json, report.html, logs.txt)"), last
    # Not a terminal: the summary is a line a row, each path whole.
    assert f"  report: {tmp_path / 'out' / 'report.html'}\n" in said


def test_a_run_that_misses_its_preemptions_is_not_a_success(tmp_path):
    """A preemption the job never reaches (step 5000 of 40): the job succeeds, the demo does not."""
    sc = {"name": "missed", "trainer": {"steps": 40, "step_seconds": 0.05}, "preemptions": [{"at_step": 5000}]}
    argv, env, token = demo_argv(tmp_path, sc, "--out", str(tmp_path / "out"))
    code, out, said = finished(argv, env, token)
    assert code == 1, said[-4000:]
    assert out["state"] == "SUCCEEDED" and out["preemptions_missed"] == ["at step 5000"]
    assert_record(tmp_path / "out", out)
    assert said.strip().splitlines()[-1] == (
        "error: the job ended SUCCEEDED before 1 of the scenario's preemptions (at step 5000): the run did not show "
        f"what it is for; the record is in {tmp_path / 'out'}")


def test_two_demos_started_at_once_from_one_folder_each_take_their_own(tmp_path):
    """Two runs of one scenario from one working directory, started together, without --out. Every name they could
    take for the next minute is taken already (as by runs started in those seconds): each makes a new one, atomically,
    and ends as its scenario expects, its record in its own folder. (invalid-spec: the shortest scenario.)"""
    parent = tmp_path / "respawn-demo-out"
    parent.mkdir()
    now = datetime.now()
    for s in range(90):
        (parent / f"invalid-spec-{now + timedelta(seconds=s):%Y%m%d-%H%M%S}").mkdir()
    taken = set(os.listdir(parent))
    # With duplicate-events.yaml's audit faults too: they are armed after the stand-ins' self-test, whose probe would
    # otherwise be the first entry dropped (the self-test failed, and with it the run).
    scenario = {**yaml.safe_load((SCENARIOS / "invalid-spec.yaml").read_text()),
                "faults": yaml.safe_load((SCENARIOS / "duplicate-events.yaml").read_text())["faults"]}
    runs = [demo_argv(tmp_path, scenario) for _ in range(2)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for argv, env, _ in runs]
    outs = []
    for (argv, env, token), proc in zip(runs, procs):
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-4000:]
        assert leftovers(token) == []
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    folders = [Path(o["summary"]).parent for o in outs]
    assert folders[0] != folders[1] and {f.parent for f in folders} == {parent}, folders
    assert not {f.name for f in folders} & taken, "a run took a folder that was there before it"
    for folder, out in zip(folders, outs):
        assert json.loads((folder / "summary.json").read_text()) == out
        assert out["state"] == "INVALID" == out["expected_state"]


def ended(**over) -> dict:
    return {"state": "SUCCEEDED", "expected_state": "SUCCEEDED", "provisioning": ["spot"], "total_steps": 300,
            "goodput": 0.4, "wall_seconds": 61.0, "preemptions_missed": [], "timed_out": False, "interrupted": False,
            **over}


@pytest.mark.parametrize("result, said", [
    (ended(), None),
    (ended(state="FAILED", expected_state="FAILED", goodput=0.0), None),  # a failure the scenario is about
    (ended(goodput=0.0), "the job ended SUCCEEDED with goodput 0: it trained none of its 300 steps in this run"),
    (ended(preemptions_missed=["at step 200"]), "the job ended SUCCEEDED before 1 of the scenario's preemptions "
                                                "(at step 200)"),
    (ended(state="RUNNING", timed_out=True), "the job did not end within the scenario's 240 s (it was RUNNING)"),
    (ended(state="FAILED"), "the job ended FAILED, the scenario expected SUCCEEDED"),
    (ended(state="RUNNING", interrupted=True), "interrupted at 61 s (the job RUNNING)"),
])
def test_what_is_not_a_success(result, said):
    from sim.demo.__main__ import _unexpected
    from sim.demo.scenario import default_scenario

    found = _unexpected(default_scenario(), result)
    assert (found is None) if said is None else (found is not None and found.startswith(said)), found


def test_one_out_folder_is_one_runs(tmp_path):
    """--out: a new or empty folder, claimed by the first run; a second run given it at once is refused."""
    from respawn.app.cli import CliError
    from sim.demo.__main__ import claim_output

    assert claim_output(tmp_path / "out", "x") == tmp_path / "out"
    with pytest.raises(CliError, match="another demo run has taken that folder"):
        claim_output(tmp_path / "out", "x")
