"""A user's ordinary trainer, for the process-tree tests (test_trainer_notice_trees.py): a tiny model trained with
TrainingLoop on synthetic data read through a DataLoader with worker processes, one rank or several under torchrun
(gloo). Prints `step N rank R` after each step (a step takes --step-seconds, so a notice lands mid-training) and,
when it stops on a notice, how many of its loader workers were still alive then (the notice must not reach them).

    python tests/notice_tree_trainer.py --steps 200 --workers 2 --start-method spawn   # checkpoints: ./respawn-checkpoints
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

from respawn.ckpt import Preempted, TrainingLoop
from respawn.ckpt.data import ResumableSampler


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(0, keepdim=True)


def loader(args, rank: int, world: int):
    sampler = ResumableSampler(Numbers(), seed=0, rank=rank, world_size=world)
    kwargs = dict(batch_size=16, sampler=sampler, num_workers=args.workers)
    if args.workers:
        kwargs.update(multiprocessing_context=args.start_method or None, persistent_workers=args.persistent)
    if args.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(Numbers(), **kwargs)
    return torch.utils.data.DataLoader(Numbers(), **kwargs)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--stateful", action="store_true", help="torchdata's StatefulDataLoader")
    p.add_argument("--helper", action="store_true", help="start a helper process of our own (a sleep)")
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--kill-workers-on-notice", action="store_true",
                   help="the loader workers die (SIGKILL: an OOM kill) once the notice has come, before the save")
    p.add_argument("--unsaveable-on-notice", action="store_true",
                   help="a user's bug: the state holds a lock from the notice on, so the emergency save fails")
    args = p.parse_args()
    torch.set_num_threads(1)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if args.helper:
        subprocess.Popen(["sleep", "600"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = loader(args, rank, world)
    extra: dict = {}
    batches = None
    try:
        with TrainingLoop(args.steps, every=50, model=model, optimizer=opt, data=data, extra=extra) as loop:
            batches = iter(data)
            notice = signal.getsignal(signal.SIGTERM)
            if args.unsaveable_on_notice:  # a handler of the user's own, chained before the library's
                signal.signal(signal.SIGTERM, lambda *a: (extra.update(lock=threading.Lock()), notice(*a)))
            if args.kill_workers_on_notice:  # after the library's: the workers die during the notice
                signal.signal(signal.SIGTERM, lambda *a: (notice(*a), [os.kill(w.pid, signal.SIGKILL)
                                                                       for w in getattr(batches, "_workers", [])]))
            for step in loop:
                train_step(args, model, opt, batches, step, rank, world)
    except Preempted:
        workers = getattr(batches, "_workers", [])
        print(f"loader workers alive at the notice: {sum(w.is_alive() for w in workers)}/{len(workers)} "
              f"rank {rank}", flush=True)
        raise
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def train_step(args, model, opt, batches, step, rank, world) -> None:
    x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    if world > 1:
        for param in model.parameters():
            dist.all_reduce(param.grad)
    opt.step()
    time.sleep(args.step_seconds)
    sys.stdout.write(f"step {step + 1} rank {rank}\n")  # one write: print() sends the text and the newline apart
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
