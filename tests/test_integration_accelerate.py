"""respawn.ckpt.accelerate (trainer/accelerate.py) with the real Accelerate: a tiny model with dropout, shuffled
synthetic data over several epochs read by 2 DataLoader workers per rank, 2 ranks under `python -m respawn.ckpt.launch torchrun` (gloo, CPU; Accelerate
reads torchrun's environment, as on a GPU node). A rank killed before its vote leaves that step uncommitted; resumed
from the periodic step before it, stopped by SIGTERM to the launcher's pid at a random step and resumed again, the
final weights are bit-identical to a plain Accelerate loop's, run without Respawn, and the emergency step loads with
a plain `accelerator.load_state(dir)`. By hand (no RESPAWN_* variables) a single process stopped by SIGTERM still
saves into ./respawn-checkpoints, and a shuffle a resume cannot repeat is named once at start. In process, a step at
an epoch's end resumes bit-identically (the CI flake of 2026-11-28: a stop at step 12, 24 or 36 of the 2-rank run).

Run as a script, this file is the trainer: `python tests/test_integration_accelerate.py [--plain] ...`.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time

STEPS, EVERY = 40, 15  # 12 batches per rank per epoch: the run crosses three epoch boundaries
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the trainer ------------------------------------------------------------------------------------------------

def say(line: str) -> None:
    """One line in one write: the ranks share the output, and print() sends the text and the newline apart when
    stdout is unbuffered (two ranks' lines then join: "…committedaccel[rank 1]: …")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def build(seed: int, seedable: bool = True):
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed

    set_seed(seed)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    gen = torch.Generator().manual_seed(1234)
    data = torch.utils.data.TensorDataset(torch.randn(96, 8, generator=gen), torch.randn(96, 1, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, num_workers=2)  # as most jobs read
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def train(argv: list[str]) -> int:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--every", type=int, default=EVERY)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--plain", action="store_true", help="Accelerate alone, no Respawn: the reference run")
    p.add_argument("--dies-before-vote", type=int, default=None, help="rank 1 exits as it would vote on this step")
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--out", default="weights.pt")
    p.add_argument("--plain-shuffle", action="store_true", help="a RandomSampler, not Accelerate's seedable one")
    args = p.parse_args(argv)
    accelerator, model, optimizer, loader, scheduler = build(args.seed, seedable=not args.plain_shuffle)
    name = f"accel[rank {accelerator.process_index}]"

    def body(step, batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        say(f"{name}: step {step + 1}/{args.steps} ")
        time.sleep(args.step_seconds)

    if args.plain:
        step = 0
        while step < args.steps:
            for batch in loader:
                if step == args.steps:
                    break
                body(step, batch)
                step += 1
    else:
        from respawn.ckpt import Preempted
        from respawn.ckpt.accelerate import RespawnAccelerate

        manager = None
        if args.dies_before_vote is not None:
            manager = dying_manager(args.dies_before_vote, args.steps)
        run = RespawnAccelerate(accelerator, args.steps, every=args.every, manager=manager)
        say(f"{name}: starting at step {run.start} of {args.steps}")
        try:
            for step, batch in run.steps(loader):
                body(step, batch)
        except Preempted as stop:
            say(f"{name}: preempted at step {run.step}; emergency checkpoint {stop.outcome.state.value}")
            raise
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), args.out)
    return 0


def load(accelerator, model, scheduler, step_dir: str) -> int:
    import torch
    from safetensors.torch import load_file

    accelerator.load_state(step_dir)
    saved = load_file(os.path.join(step_dir, "model.safetensors"))
    live = accelerator.unwrap_model(model).state_dict()
    assert saved.keys() == live.keys() and all(torch.equal(saved[k], live[k]) for k in saved)
    say(f"plain load_state: scheduler at {scheduler.scheduler.last_epoch}, weights as saved")
    return 0


def dying_manager(step: int, total: int):
    """The default manager with a seam on which rank 1 exits (code 1) when it would vote on `step`, after writing
    its files, as a rank killed mid-save would (tests/fsdp_dies_before_vote.py's injection)."""
    from respawn.ckpt import commit
    from respawn.ckpt.framework_files import FilesManager
    from respawn.ckpt.torch_sharded import GroupSeam

    class DiesBeforeVote(GroupSeam):
        def all_gather(self, key, data, control=None):
            if self.rank == 1 and key == commit.votes_key(step):
                os._exit(1)
            return super().all_gather(key, data, control)

    return FilesManager.from_env(framework="accelerate", total_steps=total, seam=DiesBeforeVote())


if __name__ == "__main__":
    sys.exit(train(sys.argv[1:]))


# ---- the tests --------------------------------------------------------------------------------------------------

import pytest  # noqa: E402 - the trainer above runs without pytest

import exit_threads  # noqa: E402
from trainer_helpers import free_port  # noqa: E402


def command(*args: str, ranks: int = 2) -> list[str]:
    launcher = [] if ranks == 1 else [
        "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1"]
    return [sys.executable, "-m", "respawn.ckpt.launch", sys.executable, *launcher, os.path.abspath(__file__), *args]


def start(cwd, log: str, cmd: list[str]) -> subprocess.Popen:
    """A run by hand in `cwd` (its checkpoints: cwd/respawn-checkpoints), the launcher leading its own group."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}  # by hand: no node agent
    env.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1")
    with open(cwd / log, "ab") as out:
        return subprocess.Popen(cmd, cwd=str(cwd), env=env, stdout=out, stderr=out, start_new_session=True)


def finish(proc, log, timeout=180) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in re.findall(r"rank \d+ of \d+ pid (\d+)", log.read_text()):  # torchrun's workers: own sessions
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"{log} did not finish in {timeout} s:\n{log.read_text()[-3000:]}")


def stop_at(proc, log, step: int) -> int:
    """SIGTERM to the launcher's pid once rank 0 has done `step` steps (`kill PID`, docker stop, a scheduler)."""
    deadline = time.monotonic() + 120
    while not re.search(rf"accel(\[rank 0\])?: step {step}/", log.read_text(errors="replace")):
        if proc.poll() is not None or time.monotonic() > deadline:
            finish(proc, log, timeout=1)
            pytest.fail(f"{log} never reached step {step}:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)
    return finish(proc, log)


def stopped(log, ranks: int = 2) -> int:
    """The one step every rank stopped at, its emergency checkpoint committed."""
    text = log.read_text(errors="replace")
    seen = {int(r or 0): (int(s), state) for r, s, state in re.findall(
        r"accel(?:\[rank (\d)\])?: preempted at step (\d+); emergency checkpoint (\w+)", text)}
    assert sorted(seen) == list(range(ranks)) and len(set(seen.values())) == 1, text[-3000:]  # one agreed step
    step, state = seen[0]
    assert state == "committed", text[-3000:]
    return step


def same(a, b) -> bool:
    import torch

    a, b = (torch.load(path, weights_only=True) for path in (a, b))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The final weights of a plain Accelerate loop (no Respawn), uninterrupted."""
    run = tmp_path_factory.mktemp("plain")
    proc = start(run, "out.log", command("--plain"))
    assert finish(proc, run / "out.log") == 0, (run / "out.log").read_text()[-3000:]
    return run / "weights.pt"


def test_a_rank_killed_before_its_vote_then_a_sigterm_resume_bit_identical_to_a_plain_loop_and_load_state_loads_it(
        tmp_path, reference):
    from respawn.ckpt import PREEMPTED_EXIT_CODE
    from respawn.ckpt import format as fmt
    from respawn.ckpt.storage import LocalStore

    # Rank 1 dies as it would vote on the periodic step 2*EVERY: that step is written, never committed, and the
    # periodic step EVERY (copied on the training thread, written off it, mid-epoch) is the newest committed one.
    log = tmp_path / "dies.log"
    code = finish(start(tmp_path, log.name, command("--dies-before-vote", str(2 * EVERY))), log)
    assert code not in (0, PREEMPTED_EXIT_CODE), log.read_text()[-3000:]
    local = LocalStore(str(tmp_path / "respawn-checkpoints"))
    steps = local.steps()
    assert steps.get(EVERY) is True and steps.get(2 * EVERY) in (False, None), steps  # written, never committed
    assert fmt.read_manifest(local.step_dir(EVERY))["kind"] == "periodic"

    # The run resumed from the periodic step, stopped by SIGTERM at a random step past it (an emergency save after a
    # resume); the last run resumes from that and ends with the plain loop's weights: both steps resumed exactly.
    wanted = random.randint(EVERY + 2, STEPS - 3)
    log = tmp_path / "notice.log"
    code = stop_at(start(tmp_path, log.name, command("--step-seconds", "0.05")), log, wanted)
    assert code == PREEMPTED_EXIT_CODE, log.read_text()[-3000:]
    assert re.search(rf"accel\[rank 1\]: starting at step {EVERY} of {STEPS}\n", log.read_text())
    at = stopped(log)
    assert wanted <= at < STEPS, (wanted, at)
    assert fmt.read_manifest(local.step_dir(at))["kind"] == "emergency"
    # The last run, and a run again after it (already complete: it restores the last step and trains nothing), each
    # under tests/exit_threads.py: as the interpreter starts to exit, only the gloo worker threads of one group
    # (Accelerate's default group) may be alive, not those of Respawn's agreement and commit (#45).
    for name in ("last", "again"):
        log = tmp_path / f"{name}.log"
        cmd = exit_threads.under(command(), os.path.abspath(__file__))
        assert finish(start(tmp_path, log.name, cmd), log) == 0, log.read_text()[-3000:]
        text = log.read_text(errors="replace")
        steps = local.steps()
        assert steps.get(STEPS) is True and max(steps) == STEPS, text[-3000:]
        exit_threads.assert_only_the_default_group(text)
        if name == "last":
            assert re.search(rf"accel\[rank 0\]: starting at step {at} of {STEPS}\n", text), text[-3000:]
        assert same(tmp_path / "weights.pt", reference), f"{name}: the final weights differ from the plain run's"
    assert f"accel[rank 1]: starting at step {STEPS} of {STEPS}" in text, text[-3000:]
    assert f"the run is already complete at step {STEPS}" in text, text[-3000:]

    # The emergency step, as Accelerate alone reads it (one process, this one; AcceleratedScheduler steps the
    # scheduler once per process: 2 per step here).
    accelerator, model, _, _, scheduler = build(7)
    assert load(accelerator, model, scheduler, local.step_dir(at)) == 0  # the weights as saved
    assert scheduler.scheduler.last_epoch == 2 * at


def test_by_hand_a_sigterm_saves_locally_and_an_unrepeatable_shuffle_is_named_at_start(tmp_path):
    from respawn.ckpt import PREEMPTED_EXIT_CODE

    log = tmp_path / "alone.log"
    proc = start(tmp_path, log.name, command("--step-seconds", "0.05", "--plain-shuffle", ranks=1))
    assert stop_at(proc, log, 4) == PREEMPTED_EXIT_CODE, log.read_text()[-3000:]
    text = log.read_text()
    step = stopped(log, ranks=1)
    assert f"checkpoints: {tmp_path}/respawn-checkpoints" in text, text[-3000:]
    assert os.path.exists(tmp_path / "respawn-checkpoints" / f"step_{step:012d}" / "COMMITTED")
    assert text.count("use_seedable_sampler=True") == 1, text[-3000:]


def test_in_process_a_step_at_an_epochs_end_resumes_bit_identically(tmp_path, monkeypatch):
    """One process (24 batches an epoch), stopped by its final save at step 24, resumed to 30: the resume skips a
    whole epoch, whose iterator draws a seed from torch's RNG the next epoch's must not see."""
    import torch
    from respawn.ckpt.accelerate import RespawnAccelerate

    for name in [k for k in os.environ if k.startswith("RESPAWN_")]:
        monkeypatch.delenv(name)

    def weights(cwd, total):
        monkeypatch.chdir(cwd)
        accelerator, model, optimizer, loader, scheduler = build(7)
        for _, (x, y) in RespawnAccelerate(accelerator, total, every=0, signals=()).steps(loader):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        return accelerator.unwrap_model(model).state_dict()

    (tmp_path / "resumed").mkdir()
    (tmp_path / "plain").mkdir()
    weights(tmp_path / "resumed", 24)
    resumed, plain = weights(tmp_path / "resumed", 30), weights(tmp_path / "plain", 30)
    assert all(torch.equal(resumed[k], plain[k]) for k in plain), "resumed at the epoch's end, the weights differ"
