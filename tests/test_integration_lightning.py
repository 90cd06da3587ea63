"""respawn.ckpt.lightning with the real Lightning: examples/workdir-lightning/train.py (a small MLP, synthetic data,
shuffled StatefulDataLoader batches read by 2 loader worker processes) as real processes, by hand (no RESPAWN_*
variables). Under `python -m respawn.ckpt.launch torchrun --nproc-per-node 2` (Lightning's DDP strategy on
torchrun's ranks, gloo on CPU) a rank killed before its vote on a periodic step leaves that step uncommitted; the run
resumed from the step before, stopped by SIGTERM to the launcher at a random step in the middle of the second epoch
and resumed again, ends with the weights, and every step's loss, bit-identical to an uninterrupted run's. A committed
step loads with plain `Trainer.fit(ckpt_path=...)` (in this process); alone, SIGTERM still saves into
./respawn-checkpoints; a train loader without state is named at start."""

from __future__ import annotations

import importlib.util
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from respawn.ckpt import PREEMPTED_EXIT_CODE
from respawn.ckpt import format as fmt
from respawn.ckpt.storage import LocalStore
import exit_threads
from trainer_helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "workdir-lightning" / "train.py"
STEPS, EVERY = 30, 10
BATCHES = 256 // (2 * 8)  # each rank's batches per epoch: train.py's 256 samples, batches of 8, over 2 ranks
FLAGS = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--log-every", "1", "--seed", "3"]


def torchrun(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "respawn.ckpt.launch", sys.executable, "-m", "torch.distributed.run", "--nnodes",
            "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--local-addr", "127.0.0.1", str(script), *FLAGS, *args]


def start(run: Path, cmd: list[str], log: str = "out.log") -> subprocess.Popen:
    run.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}  # by hand: no node agent
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{TRAIN.parent}", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    with open(run / log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=str(run), env=env, stdout=out, stderr=out, start_new_session=True)
    proc.log = run / log
    return proc


def output(proc: subprocess.Popen) -> str:
    return proc.log.read_text(errors="replace")


def finish(proc: subprocess.Popen, timeout: float = 240) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{proc.log} did not finish in {timeout} s:\n{output(proc)[-3000:]}")


def wait_for_step(proc: subprocess.Popen, name: str, step: int) -> None:
    while not re.search(rf"{name}: step {step}/{STEPS} ", output(proc)):
        if proc.poll() is not None:
            pytest.fail(f"{proc.log} ended before step {step}:\n{output(proc)[-3000:]}")
        time.sleep(0.05)


def losses(text: str, rank: int = 0) -> dict[int, str]:
    # Two ranks' lines may share a line of the log: the loss is a float.hex().
    return {int(s): loss for s, loss in re.findall(
        rf"train.py\[rank {rank}\]: step (\d+)/\d+ loss (-?0x[0-9a-f.]+p[-+]\d+)", text)}


def committed(ckpt: Path) -> list[int]:
    return sorted(s for s, ok in LocalStore(str(ckpt)).steps().items() if ok) if ckpt.exists() else []


def loader_states(path: Path) -> list[dict]:
    import torch

    return torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]


def same_weights(a: Path, b: Path) -> None:
    import torch

    left, right = torch.load(a), torch.load(b)
    assert sorted(left) == sorted(right)
    for name in left:
        assert torch.equal(left[name], right[name]), f"{name} differs"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 2-rank run without a notice: rank 0's loss at every step, and its final weights."""
    run = tmp_path_factory.mktemp("uninterrupted")
    proc = start(run, torchrun(TRAIN, "--weights-out", str(run / "weights.pt")))
    assert finish(proc) == 0, output(proc)[-3000:]
    text = output(proc)
    assert "distributed_backend=gloo" in text and "MEMBER: 2/2" in text  # Lightning's DDP over torchrun's ranks
    assert sorted(losses(text)) == list(range(1, STEPS + 1))
    return losses(text), run / "weights.pt"


# A rank of train.py that dies when it would vote on the periodic step 2*EVERY's commit, after writing its files (the
# fault goes in through the manager's seam, as tests/fsdp_dies_before_vote.py does it).
DIES_BEFORE_VOTE = f"""
import os, sys
from respawn.ckpt import commit, lightning
from respawn.ckpt.framework_files import FilesManager
from respawn.ckpt.torch_sharded import GroupSeam
import train

class DiesBeforeVote(GroupSeam):
    def all_gather(self, key, data, control=None):
        if self.rank == 1 and key == commit.votes_key({2 * EVERY}):
            print("rank 1 dies before its vote on step {2 * EVERY}", flush=True)
            os._exit(1)
        return super().all_gather(key, data, control)

class Respawn(lightning.Respawn):
    def _default_manager(self, trainer):
        return FilesManager.from_env(framework="lightning", seam=DiesBeforeVote())

train.Respawn = Respawn
sys.exit(train.main())
"""


def test_a_rank_killed_before_its_vote_then_a_sigterm_to_the_launcher_resume_bit_identical(tmp_path, uninterrupted):
    expected, weights = uninterrupted
    ckpt = tmp_path / "respawn-checkpoints"
    # Rank 1 dies when it would vote on step 2*EVERY, after both ranks wrote its files: that step is left without a
    # commit and EVERY stays the newest committed step.
    (tmp_path / "dies.py").write_text(DIES_BEFORE_VOTE)
    proc = start(tmp_path, torchrun(tmp_path / "dies.py", "--step-seconds", "0.05"), "dies.log")
    code = finish(proc)
    text = output(proc)
    assert code not in (0, PREEMPTED_EXIT_CODE), text[-3000:]
    assert f"rank 1 dies before its vote on step {2 * EVERY}" in text, text[-3000:]
    assert committed(ckpt) == [EVERY], LocalStore(str(ckpt)).steps()
    seen = {s: loss for s, loss in losses(text).items() if s <= EVERY}  # the steps the resumed run does not repeat

    # The notice at a random step of the second epoch of the run resumed from the periodic step, to the launcher:
    # every rank stops at one step, an emergency save after a resume; the last run resumes from it, mid-epoch. (With
    # loader workers the resumed loader draws its indices as Lightning creates its iterator, before it sets the
    # sampler's epoch: without the epoch in StatefulSampler's state that epoch was read in epoch 0's order.)
    at = random.randint(BATCHES + 2, STEPS - 4)
    proc = start(tmp_path, torchrun(TRAIN, "--step-seconds", "0.1"), "notice.log")
    wait_for_step(proc, r"train.py\[rank 0\]", at)
    os.kill(proc.pid, signal.SIGTERM)  # `kill PID` of the launcher: the notice for every rank
    assert finish(proc) == PREEMPTED_EXIT_CODE, output(proc)[-3000:]
    text = output(proc)
    assert re.search(rf'"message": "resuming", .*"step": {EVERY}, ', text), text[-3000:]
    stops = {int(rank): int(step) for step, rank in re.findall(
        r'"message": "stopped for the notice at the agreed step".*?"step": (\d+), "rank": (\d+), '
        r'"emergency": "committed"', text)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, (stops, text[-3000:])  # one agreed step
    step = stops[0]
    assert at <= step < STEPS and step % BATCHES and committed(ckpt)[-1] == step  # mid-epoch, the second
    manifest = fmt.read_manifest(LocalStore(str(ckpt)).step_dir(step))
    assert manifest["kind"] == "emergency" and manifest["members"] == 2 and manifest["framework"] == "lightning"
    assert "checkpoint.ckpt" in manifest["files"]
    [loader] = loader_states(Path(LocalStore(str(ckpt)).step_dir(step)) / "checkpoint.ckpt")
    main = loader["_snapshot"]["_main_snapshot"]  # a multi-process loader's state: at the last batch handed out
    assert main["_num_workers"] == 2 and loader["_snapshot"]["_snapshot_step"] == step - BATCHES, loader
    assert main["_sampler_iter_state"]["sampler_state"] == {"yielded": 8 * (step - BATCHES), "epoch": 1}, loader
    seen.update(losses(text))

    # The last run, and a fit of the finished run (it restores the last step and trains nothing), each under
    # tests/exit_threads.py: as the interpreter starts to exit, only the gloo worker threads of one group
    # (Lightning's default group) may be alive. A fit already complete has no on_train_end, and kept Respawn's groups
    # alive into the exit until teardown released them (#45).
    for name in ("last", "again"):
        cmd = exit_threads.under(torchrun(TRAIN, "--weights-out", str(tmp_path / f"{name}.pt")), TRAIN)
        proc = start(tmp_path, cmd, f"{name}.log")
        assert finish(proc) == 0, output(proc)[-3000:]
        text = output(proc)
        assert committed(ckpt)[-1] == STEPS and max(LocalStore(str(ckpt)).steps()) == STEPS, text[-3000:]
        exit_threads.assert_only_the_default_group(text)
        if name == "last":
            assert re.search(rf'"message": "resuming", .*"step": {step}, ', text), text[-3000:]
            seen.update(losses(text))
    assert f"the run is already complete at step {STEPS}" in text and not losses(text), text[-3000:]
    assert seen == expected  # every step's loss, the data order included, as without the stops
    same_weights(tmp_path / "last.pt", weights)
    same_weights(tmp_path / "again.pt", weights)


def test_outside_a_node_sigterm_saves_locally_and_plain_lightning_loads_it(tmp_path):
    """One process, no RESPAWN_* variables: the checkpoints go to ./respawn-checkpoints (printed at start); SIGTERM
    commits the step it stops at and exits 75. Plain Lightning, without Respawn, resumes from that .ckpt."""
    at = random.randint(3, STEPS - 5)
    proc = start(tmp_path, [sys.executable, str(TRAIN), *FLAGS, "--step-seconds", "0.1"])
    wait_for_step(proc, "train.py", at)
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc) == PREEMPTED_EXIT_CODE, output(proc)[-3000:]
    text = output(proc)
    assert f'"message": "checkpoints: {tmp_path / "respawn-checkpoints"}"' in text, text[-3000:]
    [step] = [int(s) for s in re.findall(r'"stopped for the notice at the agreed step".*?"step": (\d+)', text)]
    assert at <= step and committed(tmp_path / "respawn-checkpoints")[-1] == step
    path = Path(LocalStore(str(tmp_path / "respawn-checkpoints")).step_dir(step)) / "checkpoint.ckpt"
    assert plain_resume(path) == (step, STEPS)


def example():
    """train.py by its path, under a name of its own: another test's `train` module may already be in sys.modules."""
    spec = importlib.util.spec_from_file_location("respawn_lightning_example_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def plain_resume(path: Path) -> tuple[int, int]:
    """Plain Lightning in this process, no Respawn: the example's model and data, resumed from a .ckpt Respawn
    committed; the step its first batch trains at and the step it ends at."""
    import lightning as L
    import torch
    from torch.utils.data import TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).tanh()
    data = TensorDataset(x, y)
    model = example().MLP(32, lr=0.05, step_seconds=0, log_every=0)
    seen = []

    class Watch(L.Callback):
        def on_train_batch_start(self, trainer, *a):
            seen.append(trainer.global_step)

    t = L.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=False, callbacks=[Watch()])
    sampler = StatefulDistributedSampler(data, num_replicas=1, rank=0, seed=3)
    t.fit(model, StatefulDataLoader(data, batch_size=8, sampler=sampler, num_workers=2), ckpt_path=str(path))
    return seen[0], t.global_step


def test_in_process_a_loader_without_state_is_named_and_an_unfit_checkpoint_is_one_line(tmp_path, capfd,
                                                                                      monkeypatch):
    """In this process: a plain DataLoader cannot resume mid-epoch exactly, which Respawn says once, with the fix; a
    committed step that does not fit the model stops the fit in one line; RESPAWN_FRESH=1 starts over."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    train = example()
    from respawn.ckpt.framework_files import FilesManager
    from respawn.ckpt.lightning import Respawn
    from respawn.ckpt.loop import CheckpointError

    x = torch.randn(32, 16)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=8, shuffle=True)
    respawn = Respawn(every=2, manager=FilesManager(local_dir=str(tmp_path / "ckpt"), framework="lightning"))
    before = signal.getsignal(signal.SIGTERM)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[respawn])
    trainer.fit(train.MLP(8, lr=0.01, step_seconds=0, log_every=0), loader)
    assert signal.getsignal(signal.SIGTERM) is before  # the notice handler is the fit's only
    assert [cb for cb in trainer.callbacks if isinstance(cb, L.pytorch.callbacks.ModelCheckpoint)] == []
    assert committed(tmp_path / "ckpt") == [2, 3] and respawn.final.committed
    said = capfd.readouterr().err
    assert said.count("has no state_dict()") == 1 and "StatefulDataLoader" in said, said[-3000:]

    # A wider model than the committed step's: one line naming the folder and the switch, not Lightning's traceback.
    def fit(width: int, **trainer) -> Respawn:
        again = Respawn(every=2, manager=FilesManager(local_dir=str(tmp_path / "ckpt"), framework="lightning"))
        L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  callbacks=[again], **trainer).fit(train.MLP(width, lr=0.01, step_seconds=0, log_every=0), loader)
        return again

    with pytest.raises(CheckpointError, match=rf"step 3 in {tmp_path / 'ckpt'} does not fit the model .*"
                                              "RESPAWN_FRESH=1"):
        fit(16)
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setenv("RESPAWN_FRESH", "1")  # and two batches per optimizer step: saves at optimizer steps only
    assert fit(16, accumulate_grad_batches=2).start == 0 and committed(tmp_path / "ckpt") == [2, 4]
