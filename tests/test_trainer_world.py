"""FSDP2 at any world size, one rank included (trainer/examples/torch_fsdp.py under `python -m respawn.ckpt.launch
torchrun`, gloo on CPU, real processes), and restores that cannot happen fail loudly instead of starting at step 0.

- A checkpoint written by 2 ranks resumes on 1 rank (torchrun --nproc-per-node 1) at its committed step: the
  losses after it are the 2-rank run's (within float rounding: the batch's loss is reduced over another split).
  Before, the one-rank loop took the single-process path: its first periodic save raised (`mixed torch.Tensor and
  DTensor`) and the sharded checkpoint was skipped (`KeyError: 'arrays'`), training silently started at step 0.
- The one-rank run, launched without RESPAWN_STATUS_FILE (by hand, outside the node agent), takes periodic saves,
  is preempted with SIGTERM: the wrapper exits 75 (it used to pass torchrun's 1 through) and the emergency step is
  committed; that one-rank checkpoint resumes on 2 ranks again, with the 2-rank run's losses, and its state at
  step 30 is the 2-rank run's full tensors (compared through DCP).
- A sharded checkpoint restored by a job without DTensor state, and committed steps that are all unusable, raise
  NotRestorable naming the step and why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from respawn.ckpt import PREEMPTED_EXIT_CODE, CheckpointManager
from respawn.ckpt.format import NotRestorable
from test_trainer_sharded import committed, finish, losses
from trainer_helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF_STEPS, FROM = 34, 20  # the 2-rank run commits 10, 20, 30 and 34; the one-rank runs start from its step 20


def start(run, ranks: int, ckpt, *extra: str, status_file: bool = True):
    """The launch wrapper around torchrun running torch_fsdp on `ranks` ranks, in its own process group; without
    status_file, RESPAWN_STATUS_FILE is not in its environment at all (a run by hand)."""
    run.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "respawn.ckpt.launch",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--nnodes", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1",
           "-m", "respawn.ckpt.examples.torch_fsdp", "--seed", "3", "--log-every", "1", *extra]
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_STATUS_FILE"}
    env.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", RESPAWN_LOCAL_CHECKPOINT_DIR=f"{ckpt}/local",
               RESPAWN_CHECKPOINT_URI=f"file://{ckpt}/remote", RESPAWN_NOTICE_BUDGET_S="20")
    if status_file:
        env["RESPAWN_STATUS_FILE"] = str(run / "status.json")
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)


def run_to_end(run, ranks, ckpt, *extra) -> str:
    code, text = finish(start(run, ranks, ckpt, *extra), run, timeout=180)
    assert code == 0, text[-3000:]
    return text


def full_state(step_dir, out) -> dict:
    """A DCP step's every tensor, whole (DCP's own converter, one process, written to `out`): the state at any
    world size."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(step_dir), out)
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(out, weights_only=False))
    return flat


def copy_upto(src, dst, last: int) -> None:
    """The checkpoint stores of `src` with the committed steps after `last` left out."""
    for store in ("local", "remote"):
        shutil.copytree(src / store, dst / store,
                        ignore=lambda _d, names: [n for n in names if n.startswith("step_") and int(n[5:]) > last])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """An uninterrupted 2-rank run: its losses at every step and its checkpoints (10, 20, 30, 34)."""
    tmp = tmp_path_factory.mktemp("fsdp-two")
    text = run_to_end(tmp / "run", 2, tmp / "ckpt", "--steps", str(REF_STEPS), "--checkpoint-every", "10",
                      "--keep", "4")
    return tmp, losses(text)


@pytest.mark.timeout(420)
def test_fsdp2_moves_from_two_ranks_to_one_and_back(tmp_path, two_ranks):
    ref_dir, reference = two_ranks
    ckpt = tmp_path / "ckpt"
    copy_upto(ref_dir / "ckpt", ckpt, FROM)

    # 2 -> 1, by hand (no RESPAWN_STATUS_FILE): periodic saves every 2 steps at world 1, then SIGTERM.
    run = tmp_path / "one"
    proc = start(run, 1, ckpt, "--steps", "30", "--checkpoint-every", "2", "--step-seconds", "0.3",
                 status_file=False)
    deadline = time.monotonic() + 120
    while not re.search(r"torch_fsdp\[rank 0\]: step 2[3-6]/30", (run / "out.log").read_text(errors="replace")):
        assert proc.poll() is None and time.monotonic() < deadline, (run / "out.log").read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # a person's Ctrl-C / kill to the group; torchrun forwards it
    code, text = finish(proc, run)
    assert f"torch_fsdp[rank 0]: starting at step {FROM} of 30" in text, text[-3000:]
    assert code == PREEMPTED_EXIT_CODE, text[-3000:]  # torchrun itself exits 1 here
    stopped = re.findall(r"torch_fsdp\[rank 0\]: preempted at step (\d+); emergency checkpoint (\w+)", text)
    assert len(stopped) == 1 and stopped[0][1] == "committed", text[-3000:]
    step = int(stopped[0][0])
    assert FROM < step < 30 and committed(ckpt / "remote")[-1] == step
    assert [s for s in committed(ckpt / "local") if FROM < s < step], "the periodic saves at world 1 must commit"
    manifest = json.loads((ckpt / "remote" / f"step_{step:012d}" / "manifest.json").read_text())
    assert (manifest["layout"], manifest["world_size"], manifest["kind"]) == ("torch-dcp", 1, "emergency")
    mine = losses(text)
    assert set(mine) == set(range(FROM + 1, step + 1)), text[-3000:]
    for s in mine:
        assert float(mine[s]) == pytest.approx(float(reference[s]), abs=2e-6), (s, mine, reference)

    # 1 -> 2: the one-rank emergency step resumes on two ranks, which end with the 2-rank run's losses and its state
    # at step 30 (the one-rank restore itself is the run above's, from the 2-rank step FROM).
    text = run_to_end(tmp_path / "two-again", 2, ckpt, "--steps", str(REF_STEPS), "--checkpoint-every", "10")
    assert f"torch_fsdp[rank 1]: starting at step {step} of {REF_STEPS}" in text, text[-3000:]
    mine = losses(text)
    assert sorted(mine) == list(range(step + 1, REF_STEPS + 1)), text[-3000:]
    for s in mine:
        assert float(mine[s]) == pytest.approx(float(reference[s]), abs=2e-6), (s, mine, reference)
    mine, theirs = (full_state(c / "remote" / f"step_{30:012d}", tmp_path / f"{name}.pt")
                    for c, name in ((ckpt, "mine"), (ref_dir / "ckpt", "theirs")))
    assert sorted(mine) == sorted(theirs) and any(k.startswith("model.") for k in mine), (sorted(mine), sorted(theirs))
    for key in theirs:
        assert mine[key].shape == theirs[key].shape, key
        assert mine[key].double().sub(theirs[key].double()).abs().max().item() <= 1e-5, key


def test_a_sharded_checkpoint_is_never_skipped_by_an_unsharded_job(tmp_path, two_ranks):
    # A job without DTensor state (one process, or DDP) finds the FSDP2 job's checkpoints: it must not fall back
    # past them to step 0 (it did: `KeyError: 'arrays'`, a warning, and training from scratch).
    ref_dir, _ = two_ranks
    shutil.copytree(ref_dir / "ckpt" / "local", tmp_path / "ckpt")
    with pytest.raises(NotRestorable, match=rf"step {REF_STEPS} holds torch DCP shards .*world size 2"):
        CheckpointManager(local_dir=str(tmp_path / "ckpt")).restore()


def test_committed_steps_that_all_fail_to_restore_raise_instead_of_starting_at_0(tmp_path):
    import numpy as np

    mgr = CheckpointManager(local_dir=str(tmp_path / "ckpt"))
    for s in (1, 2):
        mgr.save(s, {"w": np.full(1000, s, dtype=np.float32)}, blocking=True)
    mgr.close()
    for s in (1, 2):
        data = tmp_path / "ckpt" / f"step_{s:012d}" / "data-00000.bin"
        data.write_bytes(data.read_bytes()[:-8])  # truncated: the marker is there, the data is not whole
    with pytest.raises(NotRestorable, match=r"newest: step 2: .*also tried steps \[1\]"):
        CheckpointManager(local_dir=str(tmp_path / "ckpt")).restore()
