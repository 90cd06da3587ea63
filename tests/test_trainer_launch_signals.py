"""The launch wrapper (trainer/launch.py) takes SIGTERM and SIGINT to its own pid as the notice, as it takes the
signal to its whole process group: real processes, run by hand (no RESPAWN_* variables: the wrapper's private
status file), around a single-process TrainingLoop trainer (trainer/examples/torch_mlp.py) and around torchrun with
2 ranks (trainer/examples/torch_ddp.py, gloo on CPU). Each run is stopped at a random step and must exit 75 with
every rank stopped at one step and that step's emergency checkpoint committed; the next run of the one-process
trainer starts there (a checkpoint of a run by hand, in --checkpoint-dir; torch_ddp's ranks resuming at an emergency
step, bit-identical, are test_trainer_distributed.py's).

Without the forwarding, `kill -TERM <wrapper pid>` reaches no trainer (the run goes on to its last step and exits
0), and a Ctrl-C (SIGINT to the terminal's foreground group, here twice) reaches torchrun, which hands SIGINT to
its workers: KeyboardInterrupt, no save. Either way these tests fail.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fixtures import wait_for
from respawn.ckpt import PREEMPTED_EXIT_CODE
from respawn.ckpt import format as fmt
from respawn.ckpt.storage import LocalStore
from trainer_helpers import free_port

STEPS, EVERY = 80, 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (trainer, ranks, how the signal is sent). SIGTERM and SIGINT reach one handler (launch.NOTICE_SIGNALS) whatever
# runs under the wrapper, and the wrapper is alone in its group (its launcher has a session of its own), so "Ctrl-C
# twice" is SIGINT to the pid, twice: one case per child (a trainer, torchrun) and one for SIGINT and its repeat.
CASES = [
    ("torch_mlp", 1, "SIGTERM to the pid"),
    ("torch_ddp", 2, "SIGTERM to the pid"),
    ("torch_ddp", 2, "Ctrl-C twice"),  # SIGINT to the foreground group, then again
]


def command(trainer: str, ranks: int, ckpt: str, *extra: str) -> list[str]:
    args = ["-m", f"respawn.ckpt.examples.{trainer}", "--steps", str(STEPS), "--checkpoint-every", str(EVERY),
            "--seed", "7", "--log-every", "1", "--checkpoint-dir", ckpt, *extra]
    if ranks == 1:
        launcher = [sys.executable]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                    "--local-addr", "127.0.0.1"]
    return [sys.executable, "-m", "respawn.ckpt.launch", *launcher, *args]


def start(run, cmd: list[str]) -> subprocess.Popen:
    """The wrapper as a terminal's foreground job would be: the leader of its process group."""
    run.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}  # by hand: no node agent
    env.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo")
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(cmd, cwd=str(run), env=env, stdout=out, stderr=out, start_new_session=True)


def output(run) -> str:
    return (run / "out.log").read_text(errors="replace")


def finish(proc, run, timeout=120) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in re.findall(r"rank \d+ of \d+ pid (\d+)", output(run)):  # torchrun's workers: own sessions
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"{run.name} did not finish in {timeout} s:\n{output(run)[-3000:]}")


def wait_for_step(proc, run, trainer: str, step: int) -> None:
    deadline = time.monotonic() + 90
    while not re.search(rf"{trainer}(\[rank 0\])?: step {step}/{STEPS} ", output(run)):
        if proc.poll() is not None or time.monotonic() > deadline:
            finish(proc, run, timeout=1)
            pytest.fail(f"{run.name} never reached step {step}:\n{output(run)[-3000:]}")
        time.sleep(0.05)


@pytest.mark.parametrize("trainer,ranks,how", CASES)
def test_a_signal_to_the_wrapper_is_the_notice_for_every_rank(tmp_path, trainer, ranks, how):
    ckpt = str(tmp_path / "ckpt")
    at = random.randint(3, EVERY + 10)
    run = tmp_path / "first"
    proc = start(run, command(trainer, ranks, ckpt, "--step-seconds", "0.05"))
    wait_for_step(proc, run, trainer, at)
    if how == "SIGTERM to the pid":
        os.kill(proc.pid, signal.SIGTERM)  # `kill PID`, docker stop, systemd: the main pid only
    else:
        os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGINT)
    code = finish(proc, run)
    text = output(run)
    assert code == PREEMPTED_EXIT_CODE, (how, text[-3000:])
    stopped = {int(r or 0): (int(s), state) for r, s, state in re.findall(
        rf"{trainer}(?:\[rank (\d+)\])?: preempted at step (\d+); emergency checkpoint (\w+)", text)}
    assert sorted(stopped) == list(range(ranks)), (how, text[-3000:])  # the notice reached every rank
    assert len(set(stopped.values())) == 1, (how, stopped)  # one agreed step, committed for all
    step, state = stopped[0]
    assert state == "committed" and at <= step < STEPS, (how, at, stopped)
    assert text.count("notice: SIGTERM sent to the processes that save") == 1, text[-3000:]  # once, to the ranks
    local = LocalStore(ckpt)
    assert max(s for s, committed in local.steps().items() if committed) == step
    assert fmt.read_manifest(local.step_dir(step))["kind"] == "emergency"

    if ranks == 1:  # the next run by hand starts there
        run = tmp_path / "resumed"
        proc = start(run, command(trainer, ranks, ckpt))
        assert finish(proc, run) == 0, output(run)[-3000:]
        assert re.search(rf"{trainer}: starting at step {step} of {STEPS}\n", output(run)), output(run)[-3000:]


def test_the_agent_owns_the_runs_processes_in_a_session_of_their_own(tmp_path):
    """Under the wrapper the trainer has a session of its own: the agent still finds it (its hand-over signal goes to
    the status file's pid) by the run's marker, and never a process of another run."""
    from node_agent.supervisor import RUN_MARKER, TrainerProcess, TrainerRecord

    started = "2026-01-01T00:00:00+00:00"
    ours = subprocess.Popen(["sleep", "30"], start_new_session=True, env={**os.environ, RUN_MARKER: started})
    other = subprocess.Popen(["sleep", "30"], start_new_session=True,
                             env={**os.environ, RUN_MARKER: "2026-01-02T00:00:00+00:00"})
    try:
        # Popen returns once exec has closed the close-on-exec pipe it waits on, which the kernel does before it lays
        # out the new image's environment: /proc/PID/environ read in between is empty (no marker yet).
        for proc in (ours, other):
            wait_for(lambda: Path(f"/proc/{proc.pid}/environ").read_bytes(), 10, f"process {proc.pid}'s environment",
                     interval=0.01)
        record = TrainerRecord(pid=os.getpid(), start_time=None, boot_id="b", job_id="j", attempt=1, log_offset=0,
                               started_at=started)  # the wrapper's group: not theirs
        trainer = TrainerProcess(str(tmp_path), record, child=None)
        assert trainer.owns(ours.pid)
        assert not trainer.owns(other.pid)
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert not trainer.owns(ours.pid)  # gone
