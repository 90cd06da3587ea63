"""A user's ordinary trainer, for the process-tree tests (test_trainer_notice_trees.py): a tiny model trained with
TrainingLoop on synthetic data read through a DataLoader with worker processes, one rank or several under torchrun
(gloo). Prints `step N rank R` after each step (a step takes --step-seconds, so a notice lands mid-training) and,
when it stops on a notice, how many of its loader workers were still alive then (the notice must not reach them).
With --loader KIND (repeated), one process holds a loader of each kind at once (each read every step, each saved in
the checkpoint under a key of its own), so one tree has fork, spawn and forkserver workers, persistent ones and
torchdata's StatefulDataLoader's.

    python tests/notice_tree_trainer.py --steps 200 --workers 2 --start-method spawn   # checkpoints: ./respawn-checkpoints
    python tests/notice_tree_trainer.py --loader fork --loader spawn --loader stateful
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


# --loader KIND: (start method, persistent workers, StatefulDataLoader)
KINDS = {"fork": ("fork", False, False), "spawn": ("spawn", False, False), "forkserver": ("forkserver", False, False),
         "persistent": ("", True, False), "stateful": ("", False, True)}


def loaders(args, rank: int, world: int) -> dict:
    """{kind: loader}: one per --loader, or the one the other flags describe."""
    if not args.loader:
        return {"": loader(args, rank, world, args.start_method, args.persistent, args.stateful)}
    return {kind: loader(args, rank, world, *KINDS[kind]) for kind in args.loader}


def loader(args, rank: int, world: int, start_method: str, persistent: bool, stateful: bool):
    sampler = ResumableSampler(Numbers(), seed=0, rank=rank, world_size=world)
    kwargs = dict(batch_size=16, sampler=sampler, num_workers=args.workers)
    if args.workers:
        kwargs.update(multiprocessing_context=start_method or None, persistent_workers=persistent)
    if stateful:
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
    p.add_argument("--loader", action="append", choices=sorted(KINDS), default=[],
                   help="a loader of this kind (repeat it for several at once; the flags above are then ignored)")
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
    data = loaders(args, rank, world)
    extra: dict = {}
    batches: dict = {}
    try:
        with TrainingLoop(args.steps, every=50, model=model, optimizer=opt, extra=extra,
                          **{f"data_{kind}" if kind else "data": d for kind, d in data.items()}) as loop:
            batches = {kind: iter(d) for kind, d in data.items()}
            notice = signal.getsignal(signal.SIGTERM)
            if args.unsaveable_on_notice:  # a handler of the user's own, chained before the library's
                signal.signal(signal.SIGTERM, lambda *a: (extra.update(lock=threading.Lock()), notice(*a)))
            if args.kill_workers_on_notice:  # after the library's: the workers die during the notice
                signal.signal(signal.SIGTERM, lambda *a: (notice(*a), KILL.on_notice(batches)))
            for step in loop:
                train_step(args, model, opt, batches, step, rank, world)
    except Preempted:
        each = {kind: workers({kind: it}) for kind, it in batches.items()}
        alive = " ".join(f"{kind} {sum(w.is_alive() for w in ws)}/{len(ws)}" for kind, ws in each.items() if kind)
        every = workers(batches)
        print(f"loader workers alive at the notice: {sum(w.is_alive() for w in every)}/{len(every)} rank {rank}"
              + (f" ({alive})" if alive else ""), flush=True)
        raise
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def workers(batches: dict) -> list:
    """The worker processes of these loaders' iterators."""
    return [w for it in batches.values() for w in getattr(it, "_workers", [])]


class WorkerKill:
    """--kill-workers-on-notice: the loader workers are SIGKILLed once the notice has come and before the save. A
    notice that lands while the step reads a batch kills them once the read is done: a worker killed mid-read breaks
    the user's own step (torch's fd handover fails), a crash whose restart is the last periodic checkpoint's."""

    def __init__(self) -> None:
        self.reading = self.due = False

    def on_notice(self, batches: dict) -> None:
        self.due = True
        if not self.reading:
            self.now(batches)

    def now(self, batches: dict) -> None:
        self.due = False
        for w in workers(batches):
            os.kill(w.pid, signal.SIGKILL)


KILL = WorkerKill()


def train_step(args, model, opt, batches, step, rank, world) -> None:
    first, *others = batches.values()
    KILL.reading = True
    x, y = next(first)
    for it in others:  # every loader's workers serve a batch each step
        next(it)
    KILL.reading = False
    if KILL.due:
        KILL.now(batches)
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
