"""The collective timeout (RESPAWN_COLLECTIVE_TIMEOUT_SECONDS): a 2-rank DDP job (trainer/examples/torch_ddp.py
under `python -m respawn.ckpt.launch torchrun`, gloo on CPU, real processes) whose rank 1 vanishes mid-run ends:
rank 0's collective raises and the job exits with an error, instead of blocking for gloo's default 30 minutes.

Rank 1 is frozen with SIGSTOP rather than killed: a lost VM sends no FIN, its connections just go silent, and a
killed local process would close its sockets, which gloo notices at once with or without a timeout. Without the
timeout on the examples' default group and on the loop's own groups this test hangs until its pytest-timeout guard.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from respawn import contract
from respawn.ckpt import PREEMPTED_EXIT_CODE, collective_timeout, read_status
from trainer_helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 10  # well past the 2 ranks' start-up skew on a loaded 2-core VM, far below gloo's 30 minutes


def test_the_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(contract.ENV_COLLECTIVE_TIMEOUT, raising=False)
    assert collective_timeout() == timedelta(minutes=5)
    monkeypatch.setenv(contract.ENV_COLLECTIVE_TIMEOUT, "7.5")
    assert collective_timeout() == timedelta(seconds=7.5)
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(contract.ENV_COLLECTIVE_TIMEOUT, bad)
        with pytest.raises(ValueError, match=contract.ENV_COLLECTIVE_TIMEOUT):
            collective_timeout()


@pytest.mark.timeout(300)
def test_a_vanished_rank_ends_the_survivor_within_the_collective_timeout(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cmd = [sys.executable, "-m", "respawn.ckpt.launch",
           sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1",
           "-m", "respawn.ckpt.examples.torch_ddp", "--steps", "100000", "--checkpoint-every", "0",
           "--step-seconds", "0.02", "--log-every", "100000"]
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", RESPAWN_STATUS_FILE=str(run / "status.json"),
               RESPAWN_LOCAL_CHECKPOINT_DIR=str(tmp_path / "ckpt"), RESPAWN_CHECKPOINT_URI=f"file://{tmp_path}/ckpt",
               **{contract.ENV_COLLECTIVE_TIMEOUT: str(TIMEOUT_S)})
    log = run / "out.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)
    ranks: dict[int, int] = {}
    try:
        while ((read_status(str(run / "status.json")) or {}).get("step") or 0) < 20:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        ranks = {int(r): int(p) for r, p in re.findall(r"torch_ddp: rank (\d+) of 2 pid (\d+)", log.read_text())}
        os.kill(ranks[1], signal.SIGSTOP)  # rank 1 is gone without a word: its peers' next collective waits
        # Rank 0 raises once its collective has waited TIMEOUT_S (no clock here: the pytest-timeout guard above is
        # what fails the test if it waits gloo's 30 minutes instead).
        while not re.search(r"Timed out|timed out|Timeout|timeout", _rank0_error(log.read_text(errors="replace"))):
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        os.kill(ranks[1], signal.SIGCONT)  # let torchrun's SIGTERM reach it now, not after its 30 s grace
        code = proc.wait(120)
    finally:
        _kill(proc, ranks)
    text = log.read_text(errors="replace")
    assert code not in (0, PREEMPTED_EXIT_CODE), text[-3000:]  # a failure, not a notice: the job is retried
    assert "preempted at step" not in text, text[-3000:]


def _rank0_error(text: str) -> str:
    """The lines torchrun attributes to rank 0's failure (its traceback's error line and the failure summary)."""
    return "\n".join(line for line in text.splitlines()
                     if "Error" in line or "error" in line or "rank" in line and "fail" in line.lower())


def _kill(proc, ranks: dict[int, int]) -> None:
    for pid in ranks.values():  # torchrun's workers have sessions of their own
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


BEATING = r'''
import sys, time, torch, torch.distributed as dist
from datetime import timedelta
from respawn.ckpt.distributed import collective_timeout, run_beating
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=collective_timeout())
for mode in ("ok", "fail"):  # one pair of processes for both: the failing work last
    def slow():  # three timeouts long: a download or a full checksum read of a big step
        time.sleep(3 * collective_timeout().total_seconds())
        if mode == "fail":
            raise OSError("the store went away")
        return 42
    try:
        got = run_beating(slow if rank == 0 else None, None)
        print(f"{mode}: rank {rank}: got {got}", flush=True)
    except Exception as exc:
        print(f"{mode}: rank {rank}: raised {type(exc).__name__}: {exc}", flush=True)
'''


@pytest.fixture(scope="module")
def beating():
    """Both ranks' output: rank 0 works for three collective timeouts while rank 1 waits, once returning, once
    raising."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", **{contract.ENV_COLLECTIVE_TIMEOUT: "2"})
    procs = [subprocess.Popen([sys.executable, "-c", BEATING, str(r), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    return [p.communicate(100)[0] for p in procs]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_work_longer_than_the_timeout_does_not_time_out_the_waiting_ranks(beating, mode):
    # Rank 0 works for three collective timeouts while rank 1 waits: with a plain broadcast rank 1 would time out
    # (and the restore of any large checkpoint would fail); beating, both finish, and an error in the work reaches
    # the waiting rank as an exception rather than a hang or a timeout.
    out = beating
    if mode == "ok":
        assert "ok: rank 0: got 42" in out[0] and "ok: rank 1: got None" in out[1], out
    else:
        assert "fail: rank 0: raised OSError: the store went away" in out[0], out
        assert "fail: rank 1: raised RuntimeError: another rank failed" in out[1], out
