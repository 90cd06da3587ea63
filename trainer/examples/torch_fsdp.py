"""A small PyTorch FSDP2 trainer for torchrun (gloo on CPU, NCCL on GPUs) that survives the notice: parameters and
optimizer state are sharded over the ranks (torch.distributed.fsdp.fully_shard), every rank runs the same
respawn.ckpt.TrainingLoop and writes its own shards (DCP), rank 0 commits the step. A checkpoint written by N ranks
restores on M ranks.

    torchrun --standalone --nproc-per-node 4 -m respawn.ckpt.examples.torch_fsdp --steps 300
    python -m respawn.ckpt.launch torchrun --standalone --nproc-per-node 4 -m respawn.ckpt.examples.torch_fsdp

The printed loss is the global batch's (the mean of the ranks' losses), the same quantity at any world size. No
dropout: its masks would depend on how the batch is split, so a resumed run at another world size would differ.
(--state-mb is not used here.)
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from respawn.ckpt import TrainingLoop
from respawn.ckpt.examples._common import BATCH, N, next_batch, parse_args, progress
from respawn.ckpt.examples.torch_ddp import init_distributed
from respawn.ckpt.examples.torch_mlp import D_IN, HIDDEN, regression_data
from respawn.ckpt.commit import Seam
from respawn.ckpt.torch_sharded import TorchShardedManager


def main(argv=None, seam: Callable[[], Seam] | None = None) -> int:
    """seam: builds the checkpoint commit's exchanges (default: TorchShardedManager's; a test injects a fault)."""
    args = parse_args("torch_fsdp", argv)
    rank, world, device = init_distributed("torch_fsdp", args.threads)
    if BATCH % world:
        raise SystemExit(f"torch_fsdp: the global batch ({BATCH}) must divide among {world} ranks")
    local_batch = BATCH // world

    torch.manual_seed(args.seed)  # the same initial parameters on every rank, before sharding
    x, y = (t.to(device) for t in regression_data(args.seed))

    model = torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.9)
    shuffle = torch.Generator().manual_seed(args.seed + 1)
    data = {"epoch": 0, "pos": 0, "perm": torch.randperm(N, generator=shuffle)}  # the global data position

    def train_step(step: int) -> float:
        batch = next_batch(data, lambda: torch.randperm(N, generator=shuffle))
        idx = batch[rank * local_batch:(rank + 1) * local_batch].to(device)  # this rank's slice of the global batch
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # FSDP2 reduce-scatters the gradients: each rank keeps the mean of its shard
        opt.step()
        sched.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() / world

    # Every rank writes its shards; under the node agent only rank 0 writes RESPAWN_STATUS_FILE.
    mgr = TorchShardedManager.from_env(default_dir=args.checkpoint_dir, total_steps=args.steps, keep=args.keep,
                                       seam=seam() if seam else None)
    with TrainingLoop(args.steps, every=args.checkpoint_every, manager=mgr, model=model, optimizer=opt,
                      scheduler=sched, data=data, shuffle=shuffle) as loop, \
            progress(f"torch_fsdp[rank {rank}]", args, loop) as report:
        for step in loop:
            report(step, train_step(step))

    dist.destroy_process_group()  # not after Preempted: the process exits 75 at once
    return 0


if __name__ == "__main__":
    sys.exit(main())
