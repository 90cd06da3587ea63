"""Sharded (FSDP2) state under torchrun, 4 ranks on CPU/gloo, real processes (trainer/examples/torch_fsdp.py):
every rank writes its shards through DCP and rank 0 commits the step after every rank's vote.

- A rank that exits in the middle of a periodic save (after its DCP write, before its vote) leaves that step
  uncommitted; the next run restores the previous step and repeats the lost steps with the same losses. Without the
  two-phase commit rank 0 would commit the step and the next run would start there: the test fails.
- SIGTERM to that next run's process group: every rank stops after one step, that step commits (and rank 0 uploads
  it to the file:// store), the launch wrapper exits 75; the checkpoint written by 4 ranks restores on 2 ranks (from
  the remote store alone, DCP resharding), and the first losses after the restore are the ones the uninterrupted
  run had at those steps within float rounding (the global batch's loss is reduced over another split).
- A notice deadline too short for the state (that 2-rank run's notice): every rank abandons the step by itself and
  exits 76; the step is not committed.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from respawn.ckpt import PREEMPTED_EXIT_CODE, read_status
from respawn.contract import EXIT_NOTICE_UNSAVED
from trainer_helpers import free_port

STEPS, EVERY = 60, 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(run, ranks: int, ckpt, *extra: str, env: dict | None = None, node: tuple[int, int, int] | None = None,
          trainer: tuple[str, ...] = ("-m", "respawn.ckpt.examples.torch_fsdp")):
    """`python -m respawn.ckpt.launch torchrun --nproc-per-node N -m respawn.ckpt.examples.torch_fsdp` in its own
    process group (as the node agent starts a trainer), rendezvous and gloo on 127.0.0.1 only.
    node=(node rank, nodes, master port): one host of a multi-host job (static rendezvous), with a local checkpoint
    directory of its own ({ckpt}/local-{node rank}) and the job's shared remote store. trainer: what torchrun runs."""
    run.mkdir(parents=True, exist_ok=True)
    if node is None:
        rendezvous = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
        local = f"{ckpt}/local"
    else:
        rendezvous = ["--nnodes", str(node[1]), "--node-rank", str(node[0]), "--master-addr", "127.0.0.1",
                      "--master-port", str(node[2])]
        local = f"{ckpt}/local-{node[0]}"
    cmd = [sys.executable, "-m", "respawn.ckpt.launch",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), *rendezvous,
           "--local-addr", "127.0.0.1",
           *trainer, "--checkpoint-every", str(EVERY), "--seed", "3",
           "--log-every", "1", *extra]
    env = {**os.environ, "PYTHONPATH": ROOT, "GLOO_SOCKET_IFNAME": "lo",
           "RESPAWN_LOCAL_CHECKPOINT_DIR": local, "RESPAWN_CHECKPOINT_URI": f"file://{ckpt}/remote",
           "RESPAWN_STATUS_FILE": str(run / "status.json"), "RESPAWN_NOTICE_BUDGET_S": "20", **(env or {})}
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)


def finish(proc, run, timeout=120) -> tuple[int, str]:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in re.findall(r"torch_fsdp: rank \d+ of \d+ pid (\d+)", (run / "out.log").read_text()):
            try:  # torchrun's workers have sessions of their own
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"{run.name} did not finish in {timeout} s:\n{(run / 'out.log').read_text()[-3000:]}")
    return code, (run / "out.log").read_text(errors="replace")


def preempt(proc, run, at: int) -> tuple[int, str, dict[int, tuple[int, str]]]:
    """SIGTERM to the job's process group (what the node agent does; torchrun forwards it to its workers) once
    rank 0 has reported step `at`: (exit code, output, {rank: (step it stopped at, emergency save's state)})."""
    deadline = time.monotonic() + 90
    while ((read_status(str(run / "status.json")) or {}).get("step") or 0) < at:
        assert proc.poll() is None and time.monotonic() < deadline, (run / "out.log").read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    code, text = finish(proc, run)
    stopped = {int(r): (int(s), state) for r, s, state in
               re.findall(r"torch_fsdp\[rank (\d+)\]: preempted at step (\d+); emergency checkpoint (\w+)", text)}
    return code, text, stopped


def losses(text: str, rank: int = 0) -> dict[int, str]:
    """{step: the loss printed after it} of one rank (the global batch's loss: the same on every rank)."""
    return {int(s): v for s, v in re.findall(rf"torch_fsdp\[rank {rank}\]: step (\d+)/\d+ loss (\S+)", text)}


def committed(store) -> list[int]:
    return sorted(int(d[5:]) for d in os.listdir(store) if os.path.exists(os.path.join(store, d, "COMMITTED")))


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A 4-rank run whose rank 2 exits in the save of step 2*EVERY, after its shards are written, before its vote
    (the fault goes in through the manager's seam: tests/fsdp_dies_before_vote.py). Its losses up to that step are
    the uninterrupted run's."""
    tmp = tmp_path_factory.mktemp("fsdp-killed")
    worker = os.path.join(ROOT, "tests", "fsdp_dies_before_vote.py")
    proc = start(tmp / "run", 4, tmp / "ckpt", "--steps", str(STEPS), trainer=(worker, "2", str(2 * EVERY)))
    code, text = finish(proc, tmp / "run")
    return tmp, code, text


def test_a_rank_killed_mid_save_leaves_the_step_uncommitted_and_a_notice_there_restores_at_2_ranks(tmp_path, killed):
    tmp, code, text = killed
    assert code not in (0, PREEMPTED_EXIT_CODE), text[-3000:]
    reference = losses(text)
    assert set(range(1, 2 * EVERY + 1)) <= set(reference), text[-3000:]
    # Rank 2's shards and DCP's .metadata were written: only the missing vote keeps the step from committing.
    step_dir = tmp / "ckpt" / "local" / f"step_{2 * EVERY:012d}"
    assert (step_dir / ".metadata").exists() and (step_dir / "__2_0.distcp").exists()
    assert not (step_dir / "COMMITTED").exists()
    assert committed(tmp / "ckpt" / "local") == committed(tmp / "ckpt" / "remote") == [EVERY], text[-3000:]

    # The next run at the same 4 ranks restores the previous step and repeats the lost steps with the same losses,
    # bit-exact; SIGTERM to its process group then stops every rank after one step, which commits.
    proc = start(tmp / "resumed", 4, tmp / "ckpt", "--steps", str(STEPS), "--step-seconds", "0.05")
    at = random.randint(EVERY + 2, 2 * EVERY - 10)  # room for the notice's latency: the reference ends at 2 * EVERY
    code, text, stopped = preempt(proc, tmp / "resumed", at)
    assert f"torch_fsdp[rank 0]: starting at step {EVERY} of {STEPS}" in text, text[-3000:]
    assert f"torch_fsdp[rank 3]: starting at step {EVERY} of {STEPS}" in text
    assert code == PREEMPTED_EXIT_CODE, text[-3000:]
    assert sorted(stopped) == [0, 1, 2, 3] and len(set(stopped.values())) == 1, text[-3000:]
    step, state = stopped[0]
    assert state == "committed" and at <= step <= 2 * EVERY - 2, (at, step)
    again = losses(text)
    assert again == {s: reference[s] for s in range(EVERY + 1, step + 1)}, (again, reference)  # same world size
    status = read_status(str(tmp / "resumed" / "status.json"))
    assert status["emergency"]["state"] == "committed" and status["committed_step"] == step
    assert committed(tmp / "ckpt" / "local")[-1] == committed(tmp / "ckpt" / "remote")[-1] == step

    # At 2 ranks from the remote store alone (a new node: rank 0 copies the step in), DCP resharding 4 ranks'
    # shards. An emergency step restored at the same 4 ranks, bit-exact, is the two-host test's resume below.
    ckpt = tmp_path / "ckpt-2"
    shutil.copytree(tmp / "ckpt" / "remote", ckpt / "remote")
    # Its notice comes with a budget of 0: the deadline has passed before any rank writes. Every rank must give up on
    # its own (no rank waits for a vote or an outcome past the deadline), exit 76 (stopped on the notice, nothing
    # saved: never 75), and leave the step uncommitted.
    run = tmp_path / "at-2"
    proc = start(run, 2, ckpt, "--steps", str(STEPS), "--step-seconds", "0.05", env={"RESPAWN_NOTICE_BUDGET_S": "0"})
    code, text, stopped = preempt(proc, run, step + 2)
    assert f"torch_fsdp[rank 1]: starting at step {step} of {STEPS}" in text, text[-3000:]
    resumed = losses(text)
    assert {step + 1, step + 2} <= set(resumed) and min(resumed) == step + 1, text[-3000:]
    for s in resumed:  # within float rounding: the global batch's loss is reduced over another split
        if s <= 2 * EVERY:  # the reference's steps
            assert float(resumed[s]) == pytest.approx(float(reference[s]), abs=2e-6), (s, resumed, reference)
    assert code == EXIT_NOTICE_UNSAVED, text[-3000:]
    assert sorted(stopped) == [0, 1] and {state for _, state in stopped.values()} == {"abandoned"}, text[-3000:]
    unsaved = stopped[0][0]
    assert unsaved > step and unsaved not in committed(ckpt / "local") + committed(ckpt / "remote"), stopped
    assert committed(ckpt / "remote")[-1] == step and set(committed(ckpt / "local")) <= {
        s for s in (step, 2 * EVERY) if s < unsaved}, committed(ckpt / "local")
    assert read_status(str(run / "status.json"))["emergency"]["state"] == "abandoned"


def test_two_hosts_with_their_own_disks_commit_in_the_remote_store_and_a_new_host_restores(tmp_path, killed):
    # Two hosts of 2 ranks, each with its own local directory: every rank uploads its own shards and rank 0 writes
    # the commit in the remote store; a host's local disk is never a committed copy. Then host 1 is lost (its disk
    # gone): the job resumes on a fresh host 1 from the remote store alone, bit-identical at the same world size.
    # Without the per-host uploads the remote step lacks ranks 2 and 3's shards and the resume starts elsewhere.
    reference = losses(killed[2])
    port, ckpt = free_port(), tmp_path / "ckpt"
    runs = [tmp_path / f"host-{h}" for h in (0, 1)]
    procs = [start(runs[h], 2, ckpt, "--steps", str(STEPS), "--step-seconds", "0.05", node=(h, 2, port))
             for h in (0, 1)]
    at = random.randint(EVERY + 2, 2 * EVERY - 10)
    deadline = time.monotonic() + 90
    while ((read_status(str(runs[0] / "status.json")) or {}).get("step") or 0) < at:
        assert procs[0].poll() is None and time.monotonic() < deadline, (runs[0] / "out.log").read_text()[-3000:]
        time.sleep(0.05)
    for proc in procs:  # each host's agent signals its own trainer
        os.killpg(proc.pid, signal.SIGTERM)
    results = [finish(proc, run) for proc, run in zip(procs, runs)]
    text = results[0][1] + results[1][1]
    assert [code for code, _ in results] == [PREEMPTED_EXIT_CODE] * 2, text[-3000:]
    stopped = {int(r): (int(s), state) for r, s, state in
               re.findall(r"torch_fsdp\[rank (\d+)\]: preempted at step (\d+); emergency checkpoint (\w+)", text)}
    assert sorted(stopped) == [0, 1, 2, 3] and len(set(stopped.values())) == 1, text[-3000:]
    step, state = stopped[0]
    assert state == "committed" and committed(ckpt / "remote")[-1] == step, (stopped, committed(ckpt / "remote"))
    remote_step = ckpt / "remote" / f"step_{step:012d}"
    assert {f"__{r}_0.distcp" for r in range(4)} <= set(os.listdir(remote_step)), os.listdir(remote_step)
    assert committed(ckpt / "local-1") == [], "a host's partial directory must never count as a committed step"
    assert read_status(str(runs[0] / "status.json"))["committed_durable"] == "remote"

    shutil.rmtree(ckpt / "local-1")  # host 1 is replaced: a new VM, an empty disk
    port = free_port()
    again = [tmp_path / f"again-{h}" for h in (0, 1)]
    procs = [start(again[h], 2, ckpt, "--steps", str(step + 2), node=(h, 2, port)) for h in (0, 1)]
    results = [finish(proc, run) for proc, run in zip(procs, again)]
    assert [code for code, _ in results] == [0, 0], (results[0][1] + results[1][1])[-3000:]
    assert f"torch_fsdp[rank 3]: starting at step {step} of {step + 2}" in results[1][1]
    resumed = losses(results[0][1])
    assert resumed == {s: reference[s] for s in (step + 1, step + 2)}, (resumed, reference)
