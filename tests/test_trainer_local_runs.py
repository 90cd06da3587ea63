"""Local runs without surprises (TrainingLoop, trainer/loop.py): the checkpoint folder in use is one line at the
start; a checkpoint that does not fit the model, or one past total_steps, stops the run with one line naming the
folder, the step and the switch that starts fresh (RESPAWN_FRESH=1), which deletes the old checkpoints and trains
from step 0; a finished run's folder says the run is complete; a store the first save cannot write (Cloud Storage
refusing an anonymous caller, here tests/gcs_standin.py; a local directory that refuses the write) fails the run
at that save with exit 1 and one line naming the store and the reason, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from agent_fixtures import gcs_standin
from respawn import contract
from respawn.ckpt import CheckpointManager, TrainingLoop
from respawn.ckpt import format as fmt
from respawn.ckpt.loop import ENV_FRESH, CheckpointError
from respawn.ckpt.storage import LocalStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def by_hand(monkeypatch):
    """A run by hand: none of the node agent's variables."""
    for name in list(os.environ):
        if name.startswith("RESPAWN_"):
            monkeypatch.delenv(name)


def manager(tmp_path) -> CheckpointManager:
    return CheckpointManager(local_dir=str(tmp_path / "ckpt"))


def train(tmp_path, steps: int, width: int = 8) -> TrainingLoop:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TrainingLoop(steps, every=2, manager=manager(tmp_path), model=model, optimizer=opt) as loop:
        for _ in loop:
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
    return loop


def committed(tmp_path) -> list[int]:
    return sorted(s for s, c in LocalStore(str(tmp_path / "ckpt")).steps().items() if c)


def messages(err: str) -> list[str]:
    return [json.loads(line)["message"] for line in err.splitlines() if line.startswith("{")]


def test_the_folder_in_use_is_one_line_at_the_start(tmp_path, capsys):
    train(tmp_path, 2)
    lines = [m for m in messages(capsys.readouterr().err) if m.startswith("checkpoints: ")]
    assert lines == [f"checkpoints: {tmp_path / 'ckpt'}"]


def test_a_widened_model_stops_in_one_line_and_the_switch_starts_fresh(tmp_path, monkeypatch):
    train(tmp_path, 4)
    with pytest.raises(CheckpointError) as stop:
        train(tmp_path, 6, width=16)
    message = stop.value.code
    assert "\n" not in message and "size mismatch" in message, message
    assert f"the checkpoint of step 4 in {tmp_path / 'ckpt'} does not fit model=" in message
    assert f"{ENV_FRESH}=1" in message
    assert committed(tmp_path) == [2, 4]  # nothing deleted without the switch

    monkeypatch.setenv(ENV_FRESH, "1")
    loop = train(tmp_path, 6, width=16)
    assert loop.start == 0 and committed(tmp_path) == [2, 4, 6]  # the old steps went: these are the new run's
    assert manager(tmp_path).restore()[1]["model"]["weight"].shape == (16, 4)
    monkeypatch.delenv(ENV_FRESH)
    assert train(tmp_path, 6, width=16).start == 6  # and resume as any other


def test_the_switch_is_ignored_under_the_node_agent(tmp_path, monkeypatch):
    train(tmp_path, 4)
    monkeypatch.setenv(ENV_FRESH, "1")
    monkeypatch.setenv(contract.ENV_JOB_ID, "job-1")  # a job's restart must resume, whatever its env says
    assert train(tmp_path, 6).start == 4


def test_a_checkpoint_past_total_steps_is_one_line(tmp_path):
    train(tmp_path, 6)
    with pytest.raises(CheckpointError) as stop:
        train(tmp_path, 4)
    message = stop.value.code
    assert "\n" not in message
    assert f"the checkpoint of step 6 in {tmp_path / 'ckpt'} is past total_steps=4" in message
    assert "total_steps >= 6" in message and f"{ENV_FRESH}=1" in message


def test_a_finished_runs_folder_says_the_run_is_complete(tmp_path, capsys):
    train(tmp_path, 4)
    capsys.readouterr()
    loop = train(tmp_path, 4)
    assert loop.start == 4 and loop.final.committed
    complete = [m for m in messages(capsys.readouterr().err) if "already complete" in m]
    assert complete == [f"the run is already complete at step 4 in {tmp_path / 'ckpt'}: nothing to train; to train "
                        f"again from step 0, run with {ENV_FRESH}=1 (deletes its checkpoints)"]


def test_a_local_directory_that_refuses_the_first_save_stops_the_run(tmp_path, monkeypatch):
    def refused(root, step, kind, payload, **kw):  # as a read-only directory does (root is not refused one)
        raise PermissionError(13, "Permission denied", os.path.join(root, f"step-{step}"))

    monkeypatch.setattr(fmt, "write_checkpoint", refused)
    ran = []
    with pytest.raises(CheckpointError) as stop:
        with TrainingLoop(8, every=2, manager=manager(tmp_path), data={"n": 0}) as loop:
            for step in loop:
                ran.append(step)
    message = stop.value.code
    assert "\n" not in message and f"could not be written to file://{tmp_path / 'ckpt'}" in message, message
    assert "Permission denied" in message
    # Stopped at a step boundary once the first (asynchronous) save's outcome was known: at the latest the second
    # save (after step 4) waits for it, and the next boundary stops.
    assert max(ran) <= 4 and committed(tmp_path) == []


def test_a_bucket_that_refuses_the_first_save_fails_the_run_in_one_line(tmp_path):
    """The example trainer by hand with RESPAWN_CHECKPOINT_URI=gs://... and no credentials: Cloud Storage (the
    stand-in) answers 401 to the anonymous caller's listing and uploads."""
    with gcs_standin(tmp_path, "--get", "401", "--upload", "401") as (host, _log):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
        env.update(PYTHONPATH=ROOT, STORAGE_EMULATOR_HOST=host, RESPAWN_CHECKPOINT_URI="gs://respawn-test/run")
        proc = subprocess.run([sys.executable, "-m", "respawn.ckpt.examples.torch_mlp", "--steps", "60",
                               "--checkpoint-every", "10", "--log-every", "1"], cwd=str(tmp_path), env=env,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("respawn.ckpt: the first checkpoint of this run could not be written to "
                           "gs://respawn-test/run: "), last
    assert "Anonymous credentials cannot be refreshed" in last, last  # the client's word on the 401
    start = [m for m in messages(proc.stderr) if m.startswith("checkpoints: ")]
    assert len(start) == 1 and start[0].endswith("(remote: gs://respawn-test/run)"), start
    done = [int(s) for s in re.findall(r"torch_mlp: step (\d+)/60", proc.stdout)]
    # The first save (step 10) is asynchronous; at the latest the second one waits for it: stopped by step 21.
    assert 10 <= max(done) <= 21, proc.stdout[-2000:]
