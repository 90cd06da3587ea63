"""A finished run exits 0, every time (issue #33: a 2-rank FSDP2 run of the documented loop committed its last step,
then rank 0 died with SIGABRT at exit, "terminate called without an active exception", once in six runs on a loaded
machine).

The cause: a process group the loop made (the notice agreement's, the sharded checkpoint's) was still alive when the
interpreter finalized. A gloo thread of such a group that lets go of a finished collective's tensors takes the GIL to
free their Python objects; if that happens while Python finalizes, Python ends the thread (pthread_exit) inside a
noexcept C++ frame: std::terminate, SIGABRT. The loop's last collectives (the final save's outcome, the commit
round) come just before the exit, so under load that thread is often still behind. Now the loop's end destroys the
groups it made and lets go of them, and the group's destructor joins its threads (distributed.release_group).

- Real processes, 2 ranks (gloo, CPU, FSDP2, the README's loop): after the loop and the script's own
  destroy_process_group, no gloo worker thread of the loop's groups is left (before the fix: those of two groups).
- The stress: that run repeated under CPU load (one set of runs serves both tests: the threads are counted in each);
  every rank of every run must exit 0 with the last step committed. The cause itself, a thread left, is asserted
  after every run, so one run would find it; the exits are the symptom, which the issue saw in 1 of 6 runs on a
  loaded machine. The 2 runs go at once (4 ranks on the CI machine's 2 cores, beside the suite's other workers),
  so each exit happens on a machine busier than the issue's; with the bug, the abort shows in them with
  probability 1 - (5/6)^2 = 31 %, the thread left every time.
- The node agent (node_agent/supervisor.py): a trainer whose status file says it committed total_steps and then
  exited with an error is reported as finished (exit 0) with one WARNING line; one that had not is reported as
  it exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from respawn import contract
from trainer_helpers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4
RUNS, AT_ONCE = 2, 2  # 4 ranks at once: the thread left shows in every run, the abort in some

TRAINER = textwrap.dedent('''
    """The README's FSDP2 loop, reporting the gloo worker threads (/proc/self/task) before the loop and after."""
    import gc, json, os, sys

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from respawn.ckpt import TrainingLoop, collective_timeout


    def gloo_threads():
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return sum(name.startswith("pt_gloo") for name in names)


    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=collective_timeout())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    dist.barrier()
    before = gloo_threads()
    with TrainingLoop(int(sys.argv[1]), every=2, model=model, optimizer=opt) as loop:
        for step in loop:
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()
    gc.collect()
    print(json.dumps({"rank": int(os.environ["RANK"]), "before": before, "after": gloo_threads(),
                      "committed": loop.final.committed}), flush=True)
''')


def start_job(tmp_path, name: str) -> list[subprocess.Popen]:
    """Both ranks of one run, started as torchrun would (env://), rendezvous on 127.0.0.1."""
    run = tmp_path / name
    run.mkdir()
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
        env.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                   RESPAWN_LOCAL_CHECKPOINT_DIR=str(run / "ckpt"))
        with open(run / f"rank{rank}.log", "wb") as out:
            procs.append(subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"), str(STEPS)], cwd=str(run),
                                          env=env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def finish_job(tmp_path, name: str, procs: list[subprocess.Popen]) -> list[dict]:
    """Each rank's report; fails on any exit but 0 (an abort is -6) with that rank's output."""
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(600))  # a guard only: minutes on a machine this loaded
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not finish in 600 s")
    reports = []
    for rank, code in enumerate(codes):
        text = (tmp_path / name / f"rank{rank}.log").read_text(errors="replace")
        assert code == 0, f"{name} rank {rank} exited {code}:\n{text[-3000:]}"
        reports.append(json.loads([line for line in text.splitlines() if line.startswith('{"rank"')][-1]))
    return reports


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    """Every rank's report of RUNS runs of the loop, AT_ONCE runs at a time; each rank exited 0 (finish_job)."""
    tmp_path = tmp_path_factory.mktemp("exit")
    (tmp_path / "trainer.py").write_text(TRAINER)
    reports, done = [], 0
    while done < RUNS:
        wave = [f"run{done + i}" for i in range(min(AT_ONCE, RUNS - done))]
        jobs = {name: start_job(tmp_path, name) for name in wave}
        try:
            for name, procs in jobs.items():
                reports += finish_job(tmp_path, name, procs)
        finally:
            for proc in (p for procs in jobs.values() for p in procs if p.poll() is None):
                proc.kill()
                proc.wait()
        done += len(wave)
    return reports


# One wave of 4 processes (the fixture's, run in the first test that asks for it); 8 took 110 s on a machine busy
# with the other workers.
@pytest.mark.timeout(1200)
def test_a_finished_loop_leaves_no_thread_of_its_groups(runs):
    for report in runs:
        # The default group's own threads stay (the model's mesh holds it); the loop's groups' are gone.
        assert report["after"] <= report["before"], report


@pytest.mark.timeout(1200)
def test_finished_runs_under_load_all_exit_0(runs):
    assert len(runs) == 2 * RUNS and all(r["committed"] for r in runs), runs


# ---- the node agent's reading of such an exit ------------------------------------------------------------------

DIES_AT_EXIT = textwrap.dedent('''
    import json, os, sys, time
    status = {"step": 10, "committed_step": int(sys.argv[1]), "committed_kind": "periodic",
              "committed_durable": "remote", "emergency": {"state": "idle", "step": None, "reason": None},
              "total_steps": 10, "updated_at": time.time(), "pid": os.getpid(), "generation": None, "rejoin": None}
    with open(os.environ["RESPAWN_STATUS_FILE"], "w") as f:
        json.dump(status, f)
    os.abort()  # as the interpreter's teardown did
''')


@pytest.mark.parametrize("committed,reported", [(10, 0), (8, 128 + signal.SIGABRT)])
def test_the_agent_reads_an_abort_after_the_last_commit_as_finished(tmp_path, capsys, committed, reported):
    from node_agent.supervisor import TrainerProcess

    node = tmp_path / "node"
    node.mkdir()
    env = {**os.environ, "RESPAWN_STATUS_FILE": str(node / contract.STATUS_FILE)}
    trainer = TrainerProcess.start(str(node), [sys.executable, "-c", DIES_AT_EXIT, str(committed)], env,
                                   job_id="j", attempt=1, started_at="2026-01-01T00:00:00+00:00")
    assert trainer.wait(60)
    assert trainer.poll() == (True, reported)
    warnings = [json.loads(line) for line in capsys.readouterr().out.splitlines()
                if line.startswith("{") and "the job is finished" in line]
    if reported == 0:
        assert len(warnings) == 1 and warnings[0]["severity"] == "WARNING", warnings
        assert warnings[0]["exit_code"] == 128 + signal.SIGABRT and warnings[0]["committed_step"] == 10
    else:
        assert warnings == []


def test_the_agent_reads_it_so_for_a_trainer_that_ended_unwatched(tmp_path):
    """An agent restarted after its trainer ended (trainer.exit and the status file left on the node's disk)."""
    from node_agent.supervisor import EXIT_FILE, TrainerProcess, TrainerRecord

    (tmp_path / EXIT_FILE).write_text(f"{128 + signal.SIGABRT}\n")
    (tmp_path / contract.STATUS_FILE).write_text(json.dumps({"committed_step": 10, "total_steps": 10}))
    record = TrainerRecord(pid=2 ** 22 + 1, start_time="0", boot_id="b", job_id="j", attempt=1, log_offset=0,
                           started_at="2026-01-01T00:00:00+00:00")  # not alive: no such pid
    assert TrainerProcess(str(tmp_path), record, child=None).poll() == (True, 0)
