"""A small PyTorch DDP trainer for torchrun (gloo on CPU, NCCL on GPUs) that survives the notice: every rank runs
the same respawn.ckpt.TrainingLoop, the ranks agree on the step to stop after, rank 0 writes the checkpoints.

    torchrun --standalone --nproc-per-node 2 -m respawn.ckpt.examples.torch_ddp --steps 300
    python -m respawn.ckpt.launch torchrun --standalone --nproc-per-node 2 -m respawn.ckpt.examples.torch_ddp

Every rank is seeded alike: the loop saves rank 0's global RNGs and restores them on every rank, which is exact
only when the ranks' RNGs agree (dropout masks here; each rank's data slice comes from the shared permutation).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from respawn.ckpt import CheckpointManager, TrainingLoop
from respawn.ckpt.examples._common import parse_args, progress
from respawn.ckpt.examples.torch_mlp import BATCH, D_IN, MLP, N


def main(argv=None) -> int:
    args = parse_args("torch_ddp", argv)
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    print(f"torch_ddp: rank {rank} of {world} pid {os.getpid()}", flush=True)
    if world > BATCH:
        raise SystemExit(f"torch_ddp: {world} ranks for a global batch of {BATCH}: at most {BATCH} ranks")
    # This rank's part of the global batch, as even as the world allows (3 nodes, or an elastic job's 4 of 6 ranks).
    part = slice(rank * BATCH // world, (rank + 1) * BATCH // world)

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 1000)
    x = torch.randn(N, D_IN, generator=data_gen)
    teacher = torch.randn(D_IN, 1, generator=data_gen)
    y = torch.sin(x @ teacher) + 0.1 * torch.randn(N, 1, generator=data_gen)
    x, y = x.to(device), y.to(device)

    model = DistributedDataParallel(MLP(max(1, int(args.state_mb * (1 << 20)) // 4)).to(device))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.9)
    shuffle = torch.Generator().manual_seed(args.seed + 1)
    data = {"epoch": 0, "pos": 0, "perm": torch.randperm(N, generator=shuffle)}  # the global data position

    def train_step(step: int) -> float:
        if data["pos"] + BATCH > N:
            data.update(epoch=data["epoch"] + 1, pos=0, perm=torch.randperm(N, generator=shuffle))
        idx = data["perm"][data["pos"]:data["pos"] + BATCH][part].to(device)
        data["pos"] += BATCH
        model.train()
        # The squared errors of this rank's part over the global batch, times the world size: DDP's average of the
        # ranks' gradients is then the whole batch's mean-loss gradient, whatever the parts' sizes.
        loss = ((model(x[idx]) - y[idx]) ** 2).sum() * (world / BATCH)
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
                      scheduler=sched, data=data, shuffle=shuffle) as loop, \
            progress(f"torch_ddp[rank {rank}]", args, loop) as report:
        for step in loop:
            report(step, train_step(step))

    if args.final_params and rank == 0:
        np.savez(args.final_params, **{k: v.detach().cpu().numpy() for k, v in model.module.state_dict().items()})
    dist.destroy_process_group()  # not after Preempted: the process exits 75 at once
    return 0


if __name__ == "__main__":
    sys.exit(main())
