"""A small PyTorch DDP trainer for torchrun (gloo on CPU, NCCL on GPUs) that survives the notice: every rank runs
the same respawn.ckpt.TrainingLoop, the ranks agree on the step to stop after, rank 0 writes the checkpoints.

    torchrun --standalone --nproc-per-node 2 -m respawn.ckpt.examples.torch_ddp --steps 300
    python -m respawn.ckpt.launch torchrun --standalone --nproc-per-node 2 -m respawn.ckpt.examples.torch_ddp

Every rank is seeded alike: the loop saves rank 0's global RNGs and restores them on every rank, which is exact
only when the ranks' RNGs agree: every rank runs the whole global batch (the same dropout masks) and learns from its
part of it, so they do on any world.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from respawn.ckpt import CheckpointManager, TrainingLoop, collective_timeout
from respawn.ckpt.data import forever
from respawn.ckpt.examples._common import BATCH, parse_args, progress
from respawn.ckpt.examples.torch_mlp import MLP, global_batches, regression_data


def _rank_ordered_mean(_state, bucket):  # no return annotation: DDP checks it, and this module's are strings
    """DDP's gradient average, summed in rank order: an all-reduce sums 3 or more ranks in an order that follows DDP's
    bucket layout, which DDP rebuilds after the first step of every process life, so a resumed run would round
    differently from an uninterrupted one. Gathering the ranks' buckets and adding them rank by rank does not."""
    grads = bucket.buffer()
    parts = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, grads)
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    done = torch.futures.Future()
    done.set_result(total.div_(len(parts)))
    return done


def init_distributed(name: str, threads: int) -> tuple[int, int, torch.device]:
    """The default process group of a torchrun example (NCCL on GPUs, gloo on CPU): (rank, world size, device)."""
    torch.set_num_threads(threads)
    cuda = torch.cuda.is_available()
    # A peer that vanished ends this rank in minutes (RESPAWN_COLLECTIVE_TIMEOUT_SECONDS), not gloo's 30.
    dist.init_process_group("nccl" if cuda else "gloo", timeout=collective_timeout())
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"{name}: rank {rank} of {world} pid {os.getpid()}", flush=True)
    return rank, world, torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")


def main(argv=None) -> int:
    args = parse_args("torch_ddp", argv)
    rank, world, device = init_distributed("torch_ddp", args.threads)
    if world > BATCH:
        raise SystemExit(f"torch_ddp: {world} ranks for a global batch of {BATCH}: at most {BATCH} ranks")
    # This rank's part of the global batch, as even as the world allows (3 nodes, or an elastic job's 4 of 6 ranks).
    part = slice(rank * BATCH // world, (rank + 1) * BATCH // world)

    torch.manual_seed(args.seed)
    loader = global_batches(*regression_data(args.seed), args)  # the same global batches on every rank
    batches = forever(loader)

    model = DistributedDataParallel(MLP(max(1, int(args.state_mb * (1 << 20)) // 4)).to(device))
    model.register_comm_hook(None, _rank_ordered_mean)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.9)

    def train_step(step: int) -> float:
        xb, yb = (t.to(device) for t in next(batches))
        model.train()
        # Every rank runs the whole global batch (so every rank draws the same dropout masks and its RNG stays rank
        # 0's, which is what a checkpoint keeps: the resume is exact on any world) and learns from its part: the
        # squared errors of the part, times the world size, make DDP's average of the ranks' gradients the whole
        # batch's mean-loss gradient, whatever the parts' sizes.
        loss = ((model(xb)[part] - yb[part]) ** 2).sum() * (world / BATCH)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks
        opt.step()
        sched.step()
        with torch.no_grad():
            model.module.ballast[step % model.module.ballast.numel()] += loss.detach()
        return loss.item()

    # Under the node agent only rank 0 writes RESPAWN_STATUS_FILE (CheckpointManager.from_env reads RANK).
    mgr = CheckpointManager.from_env(default_dir=args.checkpoint_dir, total_steps=args.steps, keep=args.keep)
    with TrainingLoop(args.steps, every=args.checkpoint_every, manager=mgr, model=model, optimizer=opt,
                      scheduler=sched, data=loader) as loop, \
            progress(f"torch_ddp[rank {rank}]", args, loop) as report:
        for step in loop:
            report(step, train_step(step))

    if args.final_params and rank == 0:
        np.savez(args.final_params, **{k: v.detach().cpu().numpy() for k, v in model.module.state_dict().items()})
    dist.destroy_process_group()  # not after Preempted: the process exits 75 at once
    return 0


if __name__ == "__main__":
    sys.exit(main())
