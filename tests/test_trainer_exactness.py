"""A run preempted by the notice as the node agent delivers it (SIGTERM to the processes that save, never to the
loader workers beside them) and resumed ends bit-identical to an uninterrupted
run with the same seed (PyTorch and JAX examples, real processes)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from respawn import contract
from respawn.ckpt import PREEMPTED_EXIT_CODE, read_status

STEPS, EVERY = 200, 50
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(module, tmp_path, name, *extra, env_extra=None):
    env = dict(os.environ, PYTHONPATH=ROOT, RESPAWN_JOB_ID=f"exact-{name}", RESPAWN_ATTEMPT="1",
               RESPAWN_CHECKPOINT_URI=f"file://{tmp_path}/{name}/remote",
               RESPAWN_LOCAL_CHECKPOINT_DIR=f"{tmp_path}/{name}/local",
               RESPAWN_STATUS_FILE=f"{tmp_path}/{name}/status.json", RESPAWN_NOTICE_BUDGET_S="25",
               **{contract.ENV_NOTICE_DIR: notice_dir(tmp_path, name)})
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", f"respawn.ckpt.examples.{module}", "--steps", str(STEPS), "--checkpoint-every",
           str(EVERY), "--seed", "3", "--state-mb", "1", "--final-params", f"{tmp_path}/{name}.npz", *extra]
    os.makedirs(f"{tmp_path}/{name}", exist_ok=True)
    out = open(f"{tmp_path}/{name}/out.log", "ab")
    return subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=out, stderr=out, start_new_session=True)


def notice_dir(tmp_path, name):
    """Emptied for each trainer run, as the agent does (the mark of an earlier notice must not reach the next)."""
    path = f"{tmp_path}/{name}/notice"
    shutil.rmtree(path, ignore_errors=True)
    return path


def finish(proc, tmp_path, name, timeout=240):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{name} did not finish in {timeout} s; see {tmp_path}/{name}/out.log")


def log_of(tmp_path, name):
    return open(f"{tmp_path}/{name}/out.log").read()


@pytest.mark.parametrize("module", ["torch_mlp", "jax_mlp"])
def test_preempted_and_resumed_run_is_bit_identical(module, tmp_path):
    pytest.importorskip("torch" if module == "torch_mlp" else "jax")
    reference = start(module, tmp_path, "ref")
    victim = start(module, tmp_path, "victim", "--step-seconds", "0.02")
    status_path = f"{tmp_path}/victim/status.json"
    deadline = time.monotonic() + 180
    # Preempt between two periodic checkpoints, so that only the emergency save holds the newest steps.
    while True:
        st = read_status(status_path)
        if st and st["step"] >= EVERY + 10:
            break
        if victim.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"victim run ended or stalled before step {EVERY + 10} (status {st}):\n"
                        f"{log_of(tmp_path, 'victim')[-3000:]}")
        time.sleep(0.05)
    # What the node agent does on a preemption notice; torch_mlp reads with loader workers, which a SIGTERM to the
    # whole group would kill under the save.
    assert contract.deliver_notice(f"{tmp_path}/victim/notice", lambda pid: True) == [victim.pid]
    rc = finish(victim, tmp_path, "victim")
    assert rc == PREEMPTED_EXIT_CODE, f"expected exit {PREEMPTED_EXIT_CODE} after the notice, got {rc}:\n" \
                                      f"{log_of(tmp_path, 'victim')[-3000:]}"
    st = read_status(status_path)
    assert st["emergency"]["state"] == "committed", st
    saved = st["emergency"]["step"]
    assert EVERY < saved < STEPS and saved % EVERY != 0, st
    assert st["committed_step"] == saved and st["committed_kind"] == "emergency"
    assert not os.path.exists(f"{tmp_path}/victim.npz"), "a preempted run must not report final parameters"

    resumed = start(module, tmp_path, "victim")
    assert finish(resumed, tmp_path, "victim") == 0, log_of(tmp_path, "victim")[-3000:]
    assert finish(reference, tmp_path, "ref") == 0, log_of(tmp_path, "ref")[-3000:]
    assert f"{module}: starting at step {saved} of {STEPS}" in log_of(tmp_path, "victim"), \
        "the second life did not resume from the emergency checkpoint"
    final = read_status(status_path)
    assert final["step"] == STEPS and final["committed_step"] == STEPS

    ref, got = np.load(f"{tmp_path}/ref.npz"), np.load(f"{tmp_path}/victim.npz")
    assert sorted(ref.files) == sorted(got.files)
    for k in ref.files:
        assert ref[k].tobytes() == got[k].tobytes(), f"{module}: parameter {k} differs after preempt+resume"
