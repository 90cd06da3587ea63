"""A DataLoader among TrainingLoop's objects resumes at the exact batch: a run stopped at a random step (the notice,
or a crash after a periodic save) and resumed sees the same sample indices, epoch after epoch with shuffle, and ends
with bit-identical weights (a model with dropout: the restored global RNG must stay untouched by the DataLoader),
for a plain DataLoader with respawn.ckpt.data.ResumableSampler and for torchdata's StatefulDataLoader, with 0 and 2
workers, and in a 2-rank torchrun (gloo) job sharded by ResumableSampler. A DataLoader whose position cannot be
restored is named in one WARNING at start, and the run goes on."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from torch.utils.data import (  # noqa: E402
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    TensorDataset,
)
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from respawn.ckpt import PREEMPTED_EXIT_CODE, CheckpointManager, Preempted, TrainingLoop  # noqa: E402
from respawn.ckpt.data import ResumableSampler, forever  # noqa: E402
from trainer_helpers import free_port  # noqa: E402

N, BATCH, STEPS, EVERY = 22, 4, 14, 3  # 6 batches an epoch (the last one short): the run crosses two epochs
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Crash(Exception):
    pass


def dataset():
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.arange(N), torch.randn(N, 3, generator=g), torch.randn(N, generator=g))


def loader_of(kind: str, workers: int, ds, rank: int = 0, world_size: int = 1):
    if kind == "sampler":
        sampler = ResumableSampler(ds, shuffle=True, seed=7, rank=rank, world_size=world_size)
        return DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)
    return StatefulDataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers)


def train(ckpt_dir, kind: str, workers: int, life: dict, stop: int | None = None, crash: int | None = None,
          rank: int = 0, world_size: int = 1):
    """One life of a user's script: seeded model and loader, the loop over forever(loader). Fills `life`: start
    (its first step), seen (the sample indices of each step it ran), params (the final parameters)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = loader_of(kind, workers, dataset(), rank, world_size)
    torch.manual_seed(1234)  # a restored run's global RNG must come from the checkpoint, not from here
    seen = life["seen"] = []
    mgr = CheckpointManager(local_dir=str(ckpt_dir), total_steps=STEPS)
    with TrainingLoop(STEPS, every=EVERY, manager=mgr, signals=(), model=model, optimizer=opt, data=loader) as loop:
        life["start"] = loop.start
        batches = forever(loader)
        for step in loop:
            idx, x, y = next(batches)
            seen.append(idx.tolist())
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step + 1 == stop:
                loop.manager.request_preemption("test")
            if step + 1 == crash:
                raise Crash()
    life["params"] = [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind,workers", [("sampler", 0), ("sampler", 2), ("stateful", 0), ("stateful", 2)])
def test_a_stopped_and_resumed_run_sees_the_same_batches_and_ends_bit_identical(tmp_path, kind, workers):
    ref = {}
    train(tmp_path / "ref", kind, workers, ref)
    assert ref["start"] == 0 and len(ref["seen"]) == STEPS
    assert sorted(sum(ref["seen"][:6], [])) == list(range(N)) and ref["seen"][:6] != ref["seen"][6:12], \
        "the reference run is not shuffled epoch after epoch"
    # Life 1 dies in a step after a periodic save (resumed from that save), life 2 stops on the notice.
    crash = random.randrange(EVERY + 1, STEPS - 1)
    stop = random.randrange((crash - 1) // EVERY * EVERY + 1, STEPS)
    lives = [{}, {}, {}]
    with pytest.raises(Crash):
        train(tmp_path / "run", kind, workers, lives[0], crash=crash)
    with pytest.raises(Preempted):
        train(tmp_path / "run", kind, workers, lives[1], stop=stop)
    train(tmp_path / "run", kind, workers, lives[2])
    what = f"died in step {crash}, then the notice after step {stop}"
    assert [life["start"] for life in lives] == [0, (crash - 1) // EVERY * EVERY, stop], what
    for life in lives:
        ran = ref["seen"][life["start"]:life["start"] + len(life["seen"])]
        assert life["seen"] == ran, f"{what}: the batches from step {life['start']} differ:\n" \
                                    f"resumed   {life['seen']}\nreference {ran}"
    for a, b in zip(lives[2]["params"], ref["params"]):
        assert torch.equal(a, b), f"{what}: the final weights differ from the uninterrupted run's"


def torchrun(tmp_path, name: str, stop: int) -> subprocess.Popen:
    """This file's __main__ on 2 ranks (gloo, rendezvous on 127.0.0.1), checkpoints in tmp_path/name."""
    run = tmp_path / name
    run.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1",
           os.path.abspath(__file__), str(run), str(stop)]
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(cmd, cwd=str(run), env=env, stdout=out, stderr=out, start_new_session=True)


def ranks_of(proc: subprocess.Popen, tmp_path, name: str) -> list[list[dict]]:
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"torchrun {name} did not finish in 120 s: {(tmp_path / name / 'out.log').read_text()[-3000:]}")
    files = [tmp_path / name / f"rank{r}.pt" for r in (0, 1)]
    assert all(f.exists() for f in files), (tmp_path / name / "out.log").read_text()[-3000:]
    return [torch.load(f) for f in files]


def test_a_two_rank_job_sharded_by_the_sampler_resumes_bit_identical(tmp_path):
    stop = random.randrange(1, STEPS)
    ranks = ranks_of(torchrun(tmp_path, "ddp", stop), tmp_path, "ddp")
    for rank, (whole, first, second) in enumerate(ranks):
        assert [first["exit"], first["start"], second["start"]] == [PREEMPTED_EXIT_CODE, 0, stop], (first, second)
        seen = first["seen"] + second["seen"]
        assert seen == whole["seen"], f"rank {rank}, notice after step {stop}: the batches differ\n" \
                                      f"resumed   {seen}\nreference {whole['seen']}"
        for a, b in zip(second["params"], whole["params"]):
            assert torch.equal(a, b), f"rank {rank}, notice after step {stop}: the final weights differ"
    epoch = [set(sum(whole["seen"][:3], [])) for whole, _, _ in ranks]  # 3 batches of 4: a rank's 11 samples
    assert not epoch[0] & epoch[1] and len(epoch[0] | epoch[1]) == N, f"the ranks do not share the epoch: {epoch}"


def test_the_sampler_shards_as_distributed_sampler_does_and_keeps_its_position():
    ds = dataset()
    for rank in (0, 1, 2):
        ours = ResumableSampler(ds, seed=3, rank=rank, world_size=3)
        theirs = DistributedSampler(ds, num_replicas=3, rank=rank, seed=3)
        for epoch in range(3):
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs), f"rank {rank}, epoch {epoch}"
    s = ResumableSampler(N, seed=1)
    it = iter(s)
    first = [next(it) for _ in range(5)]
    state = s.state_dict()
    assert state["epoch"] == 0 and state["position"] == 5
    again = ResumableSampler(N, seed=1)
    again.load_state_dict(state)
    again.set_epoch(0)  # a DistributedSampler-style loop's set_epoch keeps the restored position
    assert first + list(again) == list(ResumableSampler(N, seed=1)), "the restored pass does not continue"
    assert list(again) == ResumableSampler(N, seed=1).indices(1), "the pass after it is not the next epoch"
    wider = ResumableSampler(N, seed=1, rank=1, world_size=2)
    wider.load_state_dict(state)  # at another world size: the position over all ranks, per rank
    assert wider.position() == (0, 2)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


def test_a_position_that_cannot_be_restored_is_named_once_and_the_run_goes_on(tmp_path, capfd):
    ds = dataset()
    plain = DataLoader(ds, batch_size=BATCH, shuffle=True)
    stream = DataLoader(Stream(), batch_size=2)
    unordered = StatefulDataLoader(ds, sampler=RandomSampler(ds))  # a torch sampler: no state to save
    good = loader_of("sampler", 0, ds)
    batched = DataLoader(ds, batch_sampler=BatchSampler(ResumableSampler(ds), BATCH, drop_last=True))
    capfd.readouterr()
    loop = TrainingLoop(2, every=1, manager=CheckpointManager(local_dir=str(tmp_path)), signals=(),
                        plain=plain, stream=stream, unordered=unordered, good=good, batched=batched)
    with loop:
        a, b = iter(plain), iter(stream)
        for _ in loop:
            next(a), next(b)
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    warnings = [e for e in lines if e["severity"] == "WARNING" and "data position" in e["message"]]
    assert [w["object"] for w in warnings] == ["plain", "stream", "unordered"], warnings
    assert "RandomSampler" in warnings[0]["message"] and "IterableDataset" in warnings[1]["message"]
    assert "RandomSampler" in warnings[2]["message"]
    for w in warnings:
        assert "ResumableSampler" in w["message"] and "StatefulDataLoader" in w["message"], w
    assert loop.final.committed


if __name__ == "__main__":  # a rank of test_a_two_rank_job_sharded_by_the_sampler_resumes_bit_identical
    # The uninterrupted run, then the stopped one and its resumption, in one process (a torchrun start costs more
    # than this file's other tests): the resumption restores the emergency checkpoint into new objects, as a
    # restarted process does (tests/test_trainer_distributed.py restarts real processes).
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out, stop, lives = sys.argv[1], int(sys.argv[2]), []
    for ckpt, notice in (("ref", None), ("run", stop), ("run", None)):
        lives.append({"exit": 0})
        try:
            train(os.path.join(out, ckpt), "sampler", 0, lives[-1], stop=notice, rank=dist.get_rank(), world_size=2)
        except Preempted as p:
            lives[-1]["exit"] = p.code
    torch.save(lives, os.path.join(out, f"rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()
