"""JAX with Orbax under Respawn (respawn.ckpt.orbax_ckpt), with the real orbax-checkpoint: a 2-process jax.distributed
job (CPU, 127.0.0.1) whose process killed before its vote leaves no committed step although Orbax's own commit
finished, resumed, stopped by SIGTERM to its launcher at a random step and resumed again, ends bit-identical to an
uninterrupted run; what Respawn committed restores with plain Orbax; outside a node (no RESPAWN_* variables) SIGTERM
still saves into ./respawn-checkpoints. The trainer is tests/orbax_worker.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from respawn.ckpt import PREEMPTED_EXIT_CODE, read_status
from respawn.ckpt.framework_files import FilesManager

STEPS, EVERY = 30, 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "orbax_worker.py")
STEP_S = "0.05"


def env_of(tmp_path, run, node="node", **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    if node is not None:  # as the node agent runs a trainer
        env.update(RESPAWN_LOCAL_CHECKPOINT_DIR=str(tmp_path / node), RESPAWN_CHECKPOINT_URI=f"file://{tmp_path}/remote",
                   RESPAWN_STATUS_FILE=str(run / "status.json"), RESPAWN_NOTICE_BUDGET_S="20")
    return {**env, **extra}


def start(tmp_path, name, *args, processes=2, node="node", launcher=True, **extra) -> subprocess.Popen:
    """The worker's processes under `python -m respawn.ckpt.launch` (SIGTERM to its pid is the notice)."""
    run = tmp_path / name
    run.mkdir(exist_ok=True)
    cmd = [sys.executable, WORKER, "--steps", str(STEPS), "--every", str(EVERY), "--processes", str(processes), *args]
    if launcher:
        cmd = [sys.executable, "-m", "respawn.ckpt.launch", *cmd]
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(cmd, cwd=str(run), env=env_of(tmp_path, run, node, **extra), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def output(tmp_path, name) -> str:
    return (tmp_path / name / "out.log").read_text(errors="replace")


def finish(proc, tmp_path, name, timeout=150) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{name} did not finish in {timeout} s:\n{output(tmp_path, name)[-4000:]}")


def wait_until(proc, tmp_path, name, done, what) -> None:
    deadline = time.monotonic() + 120
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            finish(proc, tmp_path, name, timeout=1)
            pytest.fail(f"{name} never reached {what}:\n{output(tmp_path, name)[-4000:]}")
        time.sleep(0.05)


def status_step(tmp_path, name) -> int:
    return (read_status(str(tmp_path / name / "status.json")) or {}).get("step") or 0


def stopped(text: str, processes: int = 2) -> tuple[int, str]:
    """The step every process stopped at and its emergency save's outcome (asserting they agree)."""
    lines = {line.split("]")[0]: line.split("preempted at step ")[1] for line in text.splitlines()
             if "preempted at step" in line}
    assert len(lines) == processes and len(set(lines.values())) == 1, text[-4000:]
    step, state, _ = next(iter(lines.values())).split("; ")
    return int(step), state


def plain_orbax(path: str, like: dict) -> dict:
    """Orbax alone, as a user reads a checkpoint without Respawn: StandardCheckpointer.restore of the step's
    `state` into arrays on this process's one device (a 2-process step included)."""
    import jax
    import orbax.checkpoint as ocp

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for k, v in like.items()}
    with ocp.StandardCheckpointer() as orbax:
        return {k: np.asarray(v) for k, v in orbax.restore(path, target).items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final parameters of an uninterrupted 2-process run."""
    tmp = tmp_path_factory.mktemp("orbax-reference")
    proc = start(tmp, "run", "--final-params", f"{tmp}/final.npz", launcher=False)
    assert finish(proc, tmp, "run") == 0, output(tmp, "run")[-4000:]
    return dict(np.load(f"{tmp}/final.npz"))


def test_a_process_killed_before_its_vote_then_sigterm_resume_bit_identical_and_plain_orbax_reads_the_step(
        tmp_path, reference):
    # The notice once step EVERY is committed; process 1 is killed at the emergency save's vote, after Orbax renamed
    # the step's state/ into place (Orbax alone would call it a finished checkpoint). Process 0 waits for the vote
    # until the notice's deadline and commits nothing: step EVERY stays the newest.
    proc = start(tmp_path, "dies", "--step-seconds", "0.15", "--dies-after", str(EVERY), launcher=False,
                 RESPAWN_NOTICE_BUDGET_S="6")
    wait_until(proc, tmp_path, "dies", lambda: (tmp_path / "remote" / f"step_{EVERY:012d}" / "COMMITTED").exists(),
               f"a commit of step {EVERY}")
    os.killpg(proc.pid, signal.SIGTERM)  # every process of the job, as the node agent signals it
    code = finish(proc, tmp_path, "dies")
    text = output(tmp_path, "dies")
    assert code not in (0, PREEMPTED_EXIT_CODE), text[-4000:]  # the launcher passes on process 1's death
    line = next((line for line in text.splitlines() if "[process 0]: preempted at step" in line), text[-4000:])
    assert "; abandoned;" in line, line
    step = int(line.split("preempted at step ")[1].split(";")[0])
    assert EVERY < step < 2 * EVERY, line
    node = tmp_path / "node"
    assert (node / f"step_{step:012d}" / "state" / "commit_success.txt").exists(), text[-4000:]  # Orbax's commit
    assert not (node / f"step_{step:012d}" / "COMMITTED").exists()
    assert not (tmp_path / "remote" / f"step_{step:012d}").exists()
    assert FilesManager(f"file://{tmp_path}/remote", str(node), framework="orbax").restore()[0] == EVERY

    # The run resumed from step EVERY, stopped by SIGTERM to its launcher at a random step: an emergency save after
    # a resume, which the last run resumes from.
    at = random.randint(EVERY + 3, STEPS - 6)
    proc = start(tmp_path, "notice", "--step-seconds", STEP_S)
    wait_until(proc, tmp_path, "notice", lambda: status_step(tmp_path, "notice") >= at, f"step {at}")
    os.kill(proc.pid, signal.SIGTERM)  # the launcher's pid alone: it is the notice to every process
    code = finish(proc, tmp_path, "notice")
    text = output(tmp_path, "notice")
    assert code == PREEMPTED_EXIT_CODE, text[-4000:]
    assert f"orbax_worker[process 1]: starting at step {EVERY}" in text
    step, state = stopped(text)
    assert state == "committed" and at <= step < STEPS, (at, text[-4000:])
    status = read_status(str(tmp_path / "notice" / "status.json"))
    assert status["emergency"] == {"state": "committed", "step": step, "reason": None}
    assert status["committed_step"] == step and status["committed_durable"] == "remote"

    step_dir = tmp_path / "remote" / f"step_{step:012d}"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["framework"] == "orbax" and manifest["kind"] == "emergency" and manifest["members"] == 2
    # Orbax's own layout, both processes' parts, finalized by Orbax (renamed into place) before the vote.
    assert {"state/_METADATA", "state/commit_success.txt", "state/array_metadatas/process_0",
            "state/array_metadatas/process_1"} <= set(manifest["files"]), sorted(manifest["files"])
    assert any(f.startswith("state/ocdbt.process_1/") for f in manifest["files"])
    assert (step_dir / "COMMITTED").exists()

    # A new node (its local directory empty): the step comes from the remote store; the run ends as if never stopped.
    proc = start(tmp_path, "last", "--final-params", f"{tmp_path}/final.npz", node="new-node")
    assert finish(proc, tmp_path, "last") == 0, output(tmp_path, "last")[-4000:]
    text = output(tmp_path, "last")
    assert f"orbax_worker[process 0]: starting at step {step}" in text
    for pid in range(2):  # Orbax's save threads and its metadata writer end with each save
        assert f"orbax_worker[process {pid}]: threads left: none" in text, text[-4000:]
    final = dict(np.load(f"{tmp_path}/final.npz"))
    assert sorted(final) == sorted(reference)
    for key in reference:
        np.testing.assert_array_equal(final[key], reference[key], err_msg=key)

    # Plain Orbax reads what Respawn committed: the final step (written by 2 processes) holds the final parameters,
    # by its path and through Orbax's own CheckpointManager over the checkpoint folder.
    import orbax.checkpoint as ocp

    last = tmp_path / "remote" / f"step_{STEPS:012d}"
    assert (last / "COMMITTED").exists()
    for key, value in plain_orbax(str(last / "state"), reference).items():
        np.testing.assert_array_equal(value, reference[key], err_msg=key)
    options = ocp.CheckpointManagerOptions(step_prefix="step", step_format_fixed_length=12, read_only=True)
    with ocp.CheckpointManager(str(tmp_path / "remote"), options=options, item_names=("state",)) as orbax:
        assert orbax.latest_step() == STEPS
        assert step in orbax.all_steps()
        import jax

        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for k, v in reference.items()}
        restored = orbax.restore(STEPS, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
    for key in reference:
        np.testing.assert_array_equal(np.asarray(restored[key]), reference[key], err_msg=key)


def test_outside_a_node_sigterm_saves_into_the_working_directory_and_plain_orbax_reads_it(tmp_path):
    # No RESPAWN_* variable: one process under the launch wrapper, SIGTERM to the wrapper's pid once the first
    # periodic step is committed; the emergency step lands in ./respawn-checkpoints, as the run printed.
    proc = start(tmp_path, "alone", "--step-seconds", STEP_S, "--final-params", "stopped.npz", processes=1, node=None)
    folder = tmp_path / "alone" / "respawn-checkpoints"
    wait_until(proc, tmp_path, "alone", lambda: (folder / f"step_{EVERY:012d}" / "COMMITTED").exists(),
               f"a commit in {folder}")
    time.sleep(random.uniform(0, 0.3))
    os.kill(proc.pid, signal.SIGTERM)
    code = finish(proc, tmp_path, "alone")
    text = output(tmp_path, "alone")
    assert code == PREEMPTED_EXIT_CODE, text[-4000:]
    assert f"checkpoints: {folder}" in text
    step, state = stopped(text, processes=1)
    assert "orbax_worker[process 0]: threads left: none" in text, text[-4000:]
    assert state == "committed" and EVERY <= step < STEPS, text[-4000:]
    assert (folder / f"step_{step:012d}" / "COMMITTED").exists()
    held = dict(np.load(tmp_path / "alone" / "stopped.npz"))  # the parameters at the stop
    for key, value in plain_orbax(str(folder / f"step_{step:012d}" / "state"), held).items():
        np.testing.assert_array_equal(value, held[key], err_msg=key)


def test_processes_with_checkpoint_directories_of_their_own_are_refused_in_one_line(tmp_path):
    # Orbax's processes write one directory that process 0 finalizes: hosts with disks of their own cannot share
    # a step. Two members (threads over an in-process seam), each with its own directory and a remote store.
    from respawn.ckpt.loop import CheckpointError
    from respawn.ckpt.orbax_ckpt import OrbaxCheckpoints
    from test_trainer_framework_files import run_members

    def body(rank, seam):
        mgr = FilesManager(f"file://{tmp_path}/remote", str(tmp_path / f"host{rank}"), framework="orbax", seam=seam)
        return OrbaxCheckpoints(STEPS, EVERY, manager=mgr).restore({})

    for result in run_members(2, body):
        assert isinstance(result, CheckpointError), result
        assert "checkpoint directories of their own" in str(result) and "shared filesystem" in str(result)
