"""Multi-process JAX (jax.distributed, 2 processes on 127.0.0.1, CPU backend with gloo collectives) survives the
notice: every process stops after one agreed step, each writes its shards, process 0 commits, all exit 75, and the
resumed run ends bit-identical to an uninterrupted one; a slice run by the agent's variables alone (4 processes,
each a host with a directory of its own) stops every process at one step on a notice to one of them (without the
agreement process 0 never stops, and that test fails) and commits in the remote store; a process killed mid-save
leaves that step uncommitted and the previous one restores; processes with directories of their own (hosts) commit
in the remote store and a new host restores, and separate directories without a remote store are refused."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from respawn.ckpt import PREEMPTED_EXIT_CODE, read_status
from trainer_helpers import free_port

STEPS, EVERY, PROCESSES = 80, 25, 2  # PROCESSES: every run but the slice's
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "jax_multiprocess"


def start(tmp_path, name, *extra, processes: int = PROCESSES, node: str = "node",
          master: str | None = None) -> list[subprocess.Popen]:
    """The example's processes in one process group of their own (the node agent signals a trainer's group),
    coordinator on 127.0.0.1; checkpoints committed in the node's local directory, then copied to the remote
    store. With `master`, as the agents of a TPU slice's workers run them: no flags, each process gets
    RESPAWN_NODE_RANK/NUM_NODES/MASTER_ADDR and a local directory (and status file) of its own, so they are hosts
    with disks of their own and commit in the remote store."""
    run = tmp_path / name
    run.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT, RESPAWN_LOCAL_CHECKPOINT_DIR=f"{tmp_path}/{node}",
               RESPAWN_CHECKPOINT_URI=f"file://{tmp_path}/remote", RESPAWN_STATUS_FILE=f"{run}/status.json",
               RESPAWN_NOTICE_BUDGET_S="20")
    coordinator = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen] = []
    for pid in range(processes):
        cmd = [sys.executable, "-m", f"respawn.ckpt.examples.{NAME}", "--coordinator", coordinator,
               "--num-processes", str(processes), "--process-id", str(pid), "--steps", str(STEPS),
               "--checkpoint-every", str(EVERY), "--seed", "3", "--log-every", "1000", *extra]
        if master is not None:
            del cmd[3:9]
            env = dict(env, RESPAWN_NODE_RANK=str(pid), RESPAWN_NUM_NODES=str(processes), RESPAWN_MASTER_ADDR=master,
                       RESPAWN_LOCAL_CHECKPOINT_DIR=f"{tmp_path}/{node}.w{pid}",
                       RESPAWN_STATUS_FILE=f"{run}/status.json" if pid == 0 else f"{run}/status.w{pid}.json")
        with open(run / f"p{pid}.log", "ab") as out:
            group = procs[0].pid if procs else 0  # a group of their own, led by process 0 (setpgid: same session)
            procs.append(subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=out, stderr=out,
                                          process_group=group))
    return procs


def output(tmp_path, name) -> str:
    return "".join(log.read_text(errors="replace") for log in sorted((tmp_path / name).glob("p*.log")))


def finish(procs, tmp_path, name, timeout=120) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(max(deadline - time.monotonic(), 0.1)) for p in procs]
    except subprocess.TimeoutExpired:
        os.killpg(procs[0].pid, signal.SIGKILL)
        pytest.fail(f"{name} did not finish in {timeout} s:\n{output(tmp_path, name)[-4000:]}")


def preempted_steps(text: str) -> dict[int, int]:
    return {int(p): int(s) for p, s in re.findall(rf"{NAME}\[process (\d+)\]: preempted at step (\d+); .*? exiting 75",
                                                  text)}


def wait_for_step(procs, tmp_path, name, step: int) -> None:
    deadline = time.monotonic() + 90
    while ((read_status(str(tmp_path / name / "status.json")) or {}).get("step") or 0) < step:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            finish(procs, tmp_path, name, timeout=1)
            pytest.fail(f"{name} never reached step {step}:\n{output(tmp_path, name)[-4000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final parameters of an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("jax-mp-reference")
    procs = start(tmp, "run", "--final-params", f"{tmp}/final.npz")
    assert finish(procs, tmp, "run") == [0] * PROCESSES, output(tmp, "run")[-4000:]
    return np.load(f"{tmp}/final.npz")


def test_sigterm_to_the_group_commits_one_step_and_resumes_bit_identical(tmp_path, reference):
    at = random.randint(5, 55)
    procs = start(tmp_path, "first", "--step-seconds", "0.03")
    wait_for_step(procs, tmp_path, "first", at)
    os.killpg(procs[0].pid, signal.SIGTERM)  # what the node agent does
    codes = finish(procs, tmp_path, "first")
    text = output(tmp_path, "first")
    assert codes == [PREEMPTED_EXIT_CODE] * PROCESSES, text[-4000:]
    stopped = preempted_steps(text)
    assert sorted(stopped) == list(range(PROCESSES)) and len(set(stopped.values())) == 1, (at, text[-4000:])
    step = stopped[0]
    assert at <= step < STEPS
    status = read_status(str(tmp_path / "first" / "status.json"))
    assert status["emergency"] == {"state": "committed", "step": step, "reason": None}
    assert status["committed_durable"] == "remote"
    assert status["committed_step"] == step
    assert f"{NAME}: process 0 of {PROCESSES} pid {status['pid']}" in text  # the status file is process 0's
    manifest = json.loads((tmp_path / "remote" / f"step_{step:012d}" / "manifest.json").read_text())
    assert manifest["layout"] == "jax-sharded" and manifest["kind"] == "emergency"
    assert sorted(manifest["files"]) == ["p00000.bin", "p00000.pkl", "p00001.bin", "p00001.pkl"]
    for array in manifest["arrays"]:  # replicated arrays written once; layer 0's weight in one shard per process
        assert len(array["shards"]) == (PROCESSES if array["sharding"]["spec"] == [None, "data"] else 1), array

    # A new node: its local directory is empty, the step comes from the remote store alone.
    procs = start(tmp_path, "resumed", "--final-params", f"{tmp_path}/final.npz", node="new-node")
    assert finish(procs, tmp_path, "resumed") == [0] * PROCESSES, output(tmp_path, "resumed")[-4000:]
    text = output(tmp_path, "resumed")
    for pid in range(PROCESSES):
        assert f"{NAME}[process {pid}]: starting at step {step} of {STEPS}" in text
    final = np.load(f"{tmp_path}/final.npz")
    assert sorted(final.files) == sorted(reference.files)
    for key in reference.files:
        np.testing.assert_array_equal(final[key], reference[key], err_msg=key)


def test_a_slice_run_by_the_agents_variables_stops_at_one_step_on_one_hosts_notice(tmp_path):
    # The node agent's variables alone: the process id, the count, and the coordinator on worker 0's address at
    # JAX's Cloud TPU port. An address of 127/8 other than 127.0.0.1 (as the sim gives a slice's worker 0), random so
    # that runs beside this one do not meet on the fixed port. Each process has its own local directory: the step is
    # committed in the remote store, with every process's files. 4 processes (hosts), the notice to the last one
    # alone: the agreement among more than two (the same code as at 2) stops every process at one step; without it
    # process 0 never stops. (A new slice's restore of such a step, a lost host's files included, is
    # test_hosts_with_their_own_disks_...'s; an emergency step resumed bit-identical, test_sigterm_to_the_group_...'s.)
    from respawn.ckpt.examples.jax_multiprocess import COORDINATOR_PORT

    processes = 4
    master = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.1"
    procs = start(tmp_path, "first", "--step-seconds", "0.03", master=master, processes=processes)
    wait_for_step(procs, tmp_path, "first", random.randint(5, 40))
    procs[-1].send_signal(signal.SIGTERM)  # the last process only: the others learn of it through the agreement
    codes = finish(procs, tmp_path, "first")
    text = output(tmp_path, "first")
    assert codes == [PREEMPTED_EXIT_CODE] * processes, text[-4000:]
    for pid in range(processes):
        assert f"{NAME}: process {pid} of {processes} pid" in text
    stopped = preempted_steps(text)
    assert sorted(stopped) == list(range(processes)) and len(set(stopped.values())) == 1, text[-4000:]
    assert "preemption notice seen by another process" in text
    step = stopped[0]
    step_dir = tmp_path / "remote" / f"step_{step:012d}"
    assert (step_dir / "COMMITTED").exists()
    assert {f"p{pid:05d}.{ext}" for pid in range(processes) for ext in ("bin", "pkl")} <= set(os.listdir(step_dir))
    assert not list(tmp_path.glob("node.w*/step_*/COMMITTED"))  # the hosts' disks hold no committed step
    for pid in range(processes):  # each host's status file records the job's commit, in the remote store
        status = read_status(str(tmp_path / "first" / ("status.json" if pid == 0 else f"status.w{pid}.json")))
        assert status["emergency"]["state"] == "committed" and status["committed_step"] == step, (pid, status)
    assert COORDINATOR_PORT == 8482


def test_the_agent_environment_without_flags(monkeypatch):
    from respawn.ckpt.examples.jax_multiprocess import COORDINATOR_PORT, distributed_params

    env = {"RESPAWN_NODE_RANK": "1", "RESPAWN_NUM_NODES": "4", "RESPAWN_MASTER_ADDR": "10.0.0.11"}
    assert distributed_params(None, None, None, env) == (f"10.0.0.11:{COORDINATOR_PORT}", 4, 1)
    assert distributed_params("h:1", 2, 0, env) == ("h:1", 2, 0)  # flags win
    assert distributed_params(None, None, None, {}) == (None, 1, 0)  # one process: no jax.distributed
    assert distributed_params(None, None, None, {"RESPAWN_NUM_NODES": "1", "RESPAWN_NODE_RANK": "0",
                                                 "RESPAWN_MASTER_ADDR": "127.0.0.1"}) == (None, 1, 0)
    with pytest.raises(SystemExit, match="need a coordinator"):
        distributed_params(None, None, None, {"RESPAWN_NUM_NODES": "2"})
    with pytest.raises(SystemExit, match="process id 2 is not one of 2"):
        distributed_params(None, None, None, {**env, "RESPAWN_NODE_RANK": "2", "RESPAWN_NUM_NODES": "2"})
    with pytest.raises(SystemExit, match="RESPAWN_NUM_NODES must be a non-negative integer"):
        distributed_params(None, None, None, {"RESPAWN_NUM_NODES": "two"})


def run_workers(mode: str, root) -> list[dict]:
    coordinator = f"127.0.0.1:{free_port()}"
    worker = os.path.join(ROOT, "tests", "jax_multiprocess_worker.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, worker, mode, str(pid), coordinator, str(root)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for pid in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return [[json.loads(line[7:]) for line in out.splitlines() if line.startswith("result ")] for out in outs], outs


def test_a_process_killed_mid_save_leaves_the_step_uncommitted_and_the_previous_restores(tmp_path):
    (p0, p1), outs = run_workers("save", tmp_path)
    assert p0[0] == {"step": 10, "state": "committed"} and p1 == [{"step": 10, "state": "committed"}], outs
    assert p0[1]["step"] == 20 and p0[1]["state"] == "abandoned", outs  # process 0 waited out the deadline
    assert not (tmp_path / "step_000000000020" / "COMMITTED").exists()
    assert (tmp_path / "step_000000000010" / "COMMITTED").exists()
    results, outs = run_workers("restore", tmp_path)
    for pid, lines in enumerate(results):
        assert lines == [{"restored": 10, "rows_ok": True, "vec": [1.0, 1.0, 1.0], "key_ok": True, "local_key_ok": True,
                          "host": {"process": pid, "scale": 1.0, "local": [float(pid)] * 2}}], outs


def test_separate_directories_without_a_remote_store_are_refused(tmp_path):
    (p0, p1), outs = run_workers("unshared", tmp_path)
    assert p0 == p1 and p0[0]["state"] == "failed", outs
    assert "separate checkpoint directories" in p0[0]["reason"] and "no remote store" in p0[0]["reason"], outs
    assert not list(tmp_path.glob("*/step_*/COMMITTED"))


def test_hosts_with_their_own_disks_commit_in_the_remote_store_and_a_new_host_restores(tmp_path):
    # Each process has a directory of its own (a host of a TPU slice): each uploads its own files and process 0
    # commits in the remote store, which then holds both processes' files; no local directory holds a committed
    # step. Process 1's disk is then lost: the restore fetches its files from the remote store.
    # Without the per-host uploads the remote step would lack process 1's files and the restore would fail.
    (p0, p1), outs = run_workers("hosts-save", tmp_path)
    assert p0 == p1 == [{"step": 10, "state": "committed", "reason": None}], outs
    step_dir = tmp_path / "remote" / "step_000000000010"
    assert (step_dir / "COMMITTED").exists()
    assert {"p00000.bin", "p00000.pkl", "p00001.bin", "p00001.pkl"} <= set(os.listdir(step_dir)), outs
    assert not list(tmp_path.glob("process-*/step_*/COMMITTED"))
    shutil.rmtree(tmp_path / "process-1")
    results, outs = run_workers("hosts-restore", tmp_path)
    for pid, lines in enumerate(results):
        assert lines == [{"restored": 10, "rows_ok": True, "vec": [1.0, 1.0, 1.0], "key_ok": True, "local_key_ok": True,
                          "host": {"process": pid, "scale": 1.0, "local": [float(pid)] * 2}},
                         # Saving the restored step again is a no-op on every process: the commit is not rewritten.
                         {"again": "committed", "rewritten": False}], outs
