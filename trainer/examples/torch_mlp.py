"""A small PyTorch MLP regression trainer on locally generated data that resumes from the newest committed
checkpoint and saves an emergency checkpoint on SIGTERM (respawn.ckpt.TrainingLoop).

    python -m respawn.ckpt.examples.torch_mlp --steps 300 --checkpoint-every 50 --state-mb 64
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from respawn.ckpt import CheckpointManager, TrainingLoop
from respawn.ckpt.data import ResumableSampler, forever
from respawn.ckpt.examples._common import BATCH, N, parse_args, progress

D_IN, HIDDEN = 32, 64


class MLP(torch.nn.Module):
    def __init__(self, ballast_elems: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
        # Ballast: part of the state (checkpointed, touched every step) but not of the computation.
        self.register_buffer("ballast", torch.zeros(ballast_elems))

    def forward(self, x):
        return self.net(x)


def regression_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples' data (the same on every rank): x, and y a noisy function of it."""
    gen = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(N, D_IN, generator=gen)
    teacher = torch.randn(D_IN, 1, generator=gen)
    return x, torch.sin(x @ teacher) + 0.1 * torch.randn(N, 1, generator=gen)


def global_batches(x: torch.Tensor, y: torch.Tensor, args) -> torch.utils.data.DataLoader:
    """The global batches, shuffled epoch after epoch, read by loader worker processes as most jobs read; pass it to
    TrainingLoop (data=) and its position is restored exactly."""
    rows = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(rows, batch_size=BATCH, sampler=ResumableSampler(rows, seed=args.seed),
                                       num_workers=args.loader_workers, drop_last=True)


def main(argv=None) -> int:
    args = parse_args("torch_mlp", argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x, y = regression_data(args.seed)

    model = MLP(max(1, int(args.state_mb * (1 << 20)) // 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.9)
    loader = global_batches(x, y, args)
    batches = forever(loader)

    def train_step(step: int) -> float:
        xb, yb = next(batches)
        model.train()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            model.ballast[step % model.ballast.numel()] += loss.detach()
        return loss.item()

    mgr = CheckpointManager.from_env(default_dir=args.checkpoint_dir, total_steps=args.steps, keep=args.keep)
    # Restores model, optimizer, scheduler, data position, generator and global RNGs in place; saves every
    # --checkpoint-every steps; on SIGTERM saves at the step boundary and exits 75; final save after the last step.
    with TrainingLoop(args.steps, every=args.checkpoint_every, manager=mgr, model=model, optimizer=opt,
                      scheduler=sched, data=loader) as loop, \
            progress("torch_mlp", args, loop) as report:
        for step in loop:
            report(step, train_step(step))

    if args.final_params:
        arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        np.savez(args.final_params, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
