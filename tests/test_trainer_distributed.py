"""A torchrun DDP job (2 ranks, gloo on CPU, real processes) survives the notice: the ranks agree on one step, rank 0
alone writes the checkpoint and the status file, the launch wrapper exits 75, and the resumed run ends
bit-identical to an uninterrupted one. The notice is delivered to one rank only and still stops every rank at one
step: without the agreement rank 0 never stops, and that test fails. The same job shape under the real node agent on
a sim node (the launch wrapper around torchrun, 2 ranks with loader workers), which stops every rank at one step and
reports the committed step and exit 75 in its heartbeat, is test_trainer_notice_trees.py's
test_the_agents_notice_becomes_a_committed_emergency_checkpoint_in_every_rank[torchrun, workers in every rank]."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from respawn.ckpt import PREEMPTED_EXIT_CODE, CheckpointManager, read_status
from trainer_helpers import free_port

STEPS, EVERY = 90, 40
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(*extra: str, ranks: int = 2) -> list[str]:
    """The launch wrapper around torchrun, `ranks` ranks on one node, rendezvous on 127.0.0.1 only."""
    return [sys.executable, "-m", "respawn.ckpt.launch",
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1",
            "-m", "respawn.ckpt.examples.torch_ddp", "--steps", str(STEPS), "--checkpoint-every", str(EVERY),
            "--seed", "5", "--log-every", "1000", *extra]


def start(tmp_path, name, *extra, ranks: int = 2):
    """`python -m respawn.ckpt.launch torchrun --nproc-per-node 2 -m respawn.ckpt.examples.torch_ddp` in its own
    process group (as the node agent starts a trainer), rendezvous and gloo on 127.0.0.1 only."""
    run = tmp_path / name
    run.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", RESPAWN_JOB_ID=f"ddp-{name}",
               RESPAWN_ATTEMPT="1", RESPAWN_CHECKPOINT_URI=f"file://{tmp_path}/ckpt/remote",
               RESPAWN_LOCAL_CHECKPOINT_DIR=f"{tmp_path}/ckpt/local", RESPAWN_STATUS_FILE=f"{run}/status.json",
               RESPAWN_NOTICE_BUDGET_S="20")
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(torchrun(*extra, ranks=ranks), cwd=str(tmp_path), env=env, stdout=out, stderr=out,
                                start_new_session=True)


def output(tmp_path, name) -> str:
    return (tmp_path / name / "out.log").read_text(errors="replace")


def finish(proc, tmp_path, name, timeout=90) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids(output(tmp_path, name)).values():  # torchrun's workers have sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"{name} did not finish in {timeout} s; see {tmp_path / name / 'out.log'}:\n"
                    f"{output(tmp_path, name)[-3000:]}")


def pids(text: str) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r"torch_ddp: rank (\d+) of 2 pid (\d+)", text)}


def preempted_steps(text: str) -> dict[int, int]:
    return {int(r): int(s) for r, s in re.findall(r"torch_ddp\[rank (\d+)\]: preempted at step (\d+); .*? exiting 75",
                                                  text)}


def wait_for_step(proc, tmp_path, name, step: int) -> None:
    deadline = time.monotonic() + 60
    while ((read_status(str(tmp_path / name / "status.json")) or {}).get("step") or 0) < step:
        if proc.poll() is not None or time.monotonic() > deadline:
            finish(proc, tmp_path, name, timeout=1)
            pytest.fail(f"{name} never reached step {step}:\n{output(tmp_path, name)[-3000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final parameters of an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("ddp-reference")
    proc = start(tmp, "run", "--final-params", f"{tmp}/final.npz")
    assert finish(proc, tmp, "run") == 0, output(tmp, "run")[-3000:]
    return np.load(f"{tmp}/final.npz")


def test_notice_to_one_rank_stops_every_rank_at_one_step_and_resumes_bit_identical(tmp_path, reference):
    # The notice to the job's savers under the node agent is test_trainer_notice_trees.py's.
    at = random.randint(10, 60)
    proc = start(tmp_path, "first", "--step-seconds", "0.03")
    wait_for_step(proc, tmp_path, "first", at)
    os.kill(pids(output(tmp_path, "first"))[1], signal.SIGTERM)  # rank 1 only: rank 0 learns it from the agreement
    code = finish(proc, tmp_path, "first")
    text = output(tmp_path, "first")
    # torchrun itself reports the workers' 75 as a failed group (exit 1); the wrapper reads the status file.
    assert code == PREEMPTED_EXIT_CODE, text[-3000:]
    stopped = preempted_steps(text)
    assert sorted(stopped) == [0, 1] and len(set(stopped.values())) == 1, (at, text[-3000:])
    assert "preemption notice seen by another rank" in text
    step = stopped[0]
    assert at <= step < STEPS
    status = read_status(str(tmp_path / "first" / "status.json"))
    assert status["emergency"] == {"state": "committed", "step": step, "reason": None}
    assert status["committed_step"] == step
    assert status["pid"] == pids(text)[0]  # written by rank 0, the only rank that knows what is committed

    proc = start(tmp_path, "resumed", "--final-params", f"{tmp_path}/final.npz")
    assert finish(proc, tmp_path, "resumed") == 0, output(tmp_path, "resumed")[-3000:]
    text = output(tmp_path, "resumed")
    assert f"torch_ddp[rank 0]: starting at step {step} of {STEPS}" in text
    assert f"torch_ddp[rank 1]: starting at step {step} of {STEPS}" in text
    final = np.load(f"{tmp_path}/final.npz")
    assert sorted(final.files) == sorted(reference.files)
    for key in reference.files:
        np.testing.assert_array_equal(final[key], reference[key], err_msg=key)


def test_only_rank_0_gets_the_status_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPAWN_STATUS_FILE", str(tmp_path / "status.json"))
    monkeypatch.setenv("RANK", "1")
    assert CheckpointManager.from_env(default_dir=str(tmp_path / "ckpt")).status.path is None
    assert not (tmp_path / "status.json").exists()
    monkeypatch.setenv("RANK", "0")
    assert CheckpointManager.from_env(default_dir=str(tmp_path / "ckpt")).status.path == str(tmp_path / "status.json")
    assert (tmp_path / "status.json").exists()


def test_the_launch_wrapper_reads_only_this_runs_status_file_and_says_75_only_for_a_committed_save():
    from respawn.ckpt.launch import notice_exit

    ended = {"emergency": {"state": "committed", "step": 7, "reason": None}, "updated_at": 100.0}
    assert notice_exit(ended, since=99.0, noticed=False) == 75
    assert notice_exit(ended, since=101.0, noticed=False) is None  # left by an earlier run
    assert notice_exit(ended, since=101.0, noticed=True) == 76  # this run's notice, and no save of its own
    for unsaved in ("failed", "abandoned"):
        assert notice_exit({**ended, "emergency": {"state": unsaved, "step": 7, "reason": "x"}}, 99.0, False) == 76
    saving = {**ended, "emergency": {"state": "saving", "step": 7, "reason": None}}
    assert notice_exit(saving, since=99.0, noticed=False) is None
    assert notice_exit(saving, since=99.0, noticed=True) == 76
    assert notice_exit(None, since=0.0, noticed=False) is None


def test_sharded_parameters_make_every_rank_a_writer():
    # One process is enough for a DTensor; Job itself is what TrainingLoop builds on every rank of a real job.
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    from respawn.ckpt.distributed import TorchJob

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 4)
        job = TorchJob({"model": model, "data": {"pos": 0}})  # plain (DDP-style) parameters: rank 0 writes
        assert job.sharded is None
        model.weight = torch.nn.Parameter(distribute_tensor(model.weight.data, DeviceMesh("cpu", [0]), [Shard(0)]))
        objects = {"model": model}
        job = TorchJob(objects)  # DTensor parameters: every rank writes its shards (test_trainer_sharded.py)
        assert job.sharded is objects and job.writer
    finally:
        dist.destroy_process_group()


def test_a_world_that_does_not_divide_the_batch_trains(tmp_path, reference):
    # 3 ranks (3 nodes of a hybrid job, or an elastic job's survivors) split the global batch of 64 unevenly (22, 21,
    # 21): the example used to refuse any world that does not divide 64. The weights move away from their start as
    # the 2-rank run's do (dropout masks differ with the split, so the two runs are not the same numbers).
    proc = start(tmp_path, "three", "--final-params", f"{tmp_path}/final.npz", ranks=3)
    assert finish(proc, tmp_path, "three") == 0, output(tmp_path, "three")[-3000:]
    assert "torch_ddp: rank 2 of 3" in output(tmp_path, "three")
    final = np.load(f"{tmp_path}/final.npz")
    for key in (k for k in reference.files if k != "ballast"):
        assert np.isfinite(final[key]).all(), key
        # Same seed, same init: both runs moved their weights by a comparable amount.
        assert np.abs(final[key] - reference[key]).max() < 0.5 * np.abs(reference[key]).max() + 0.1, key
