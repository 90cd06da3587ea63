"""A Lightning user's training script under Respawn: a small MLP built in code, synthetic data, shuffled batches.
The Respawn lines are marked `# Respawn`; the rest is plain Lightning.

    python train.py --steps 300                                            # one process (by hand, or on a node)
    python -m respawn.ckpt.launch torchrun --nproc-per-node 2 train.py     # DDP: Lightning reads torchrun's ranks

By hand its checkpoints go to ./respawn-checkpoints; on a Respawn node to the job's checkpoint_uri. SIGTERM (or
Ctrl-C through respawn.ckpt.launch) stops every rank at one step, commits that step and exits 75; the next run
resumes there, the data position included (StatefulDataLoader with Respawn's StatefulSampler).
"""

import argparse
import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader  # Respawn: the data position is saved and restored

from respawn.ckpt.lightning import Respawn, StatefulSampler  # Respawn


class MLP(L.LightningModule):
    def __init__(self, width: int, lr: float, step_seconds: float, log_every: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
        self.lr, self.step_seconds, self.log_every = lr, step_seconds, log_every

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        step = self.global_step + 1  # the step this batch completes
        if self.log_every and (step % self.log_every == 0 or step == self.trainer.max_steps):
            print(f"{tag()}: step {step}/{self.trainer.max_steps} loss {loss.item().hex()}", flush=True)
        if self.step_seconds:
            time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def tag() -> str:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return "train.py" if world == 1 else f"train.py[rank {os.environ.get('RANK', '0')}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--loader-workers", type=int, default=2, help="the train loader's worker processes")
    p.add_argument("--weights-out", default=None, help="rank 0 writes the final weights here (torch.save)")
    args = p.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).tanh()
    data = TensorDataset(x, y)
    # Respawn: shuffled, this rank's share, its position resumed exactly (was: DataLoader(data, ..., shuffle=True))
    loader = StatefulDataLoader(data, batch_size=args.batch_size, sampler=StatefulSampler(data, seed=args.seed),
                                num_workers=args.loader_workers)  # loader worker processes, as most jobs read
    model = MLP(args.width, lr=0.05, step_seconds=args.step_seconds, log_every=args.log_every)

    # Under torchrun: DDP over its processes (LOCAL_WORLD_SIZE per node), gloo on CPU.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // local
    ddp = dict(strategy="ddp", devices=local, num_nodes=nodes) if local * nodes > 1 else dict(devices=1)
    respawn = Respawn(every=args.checkpoint_every)  # Respawn
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[respawn], **ddp)  # Respawn: callbacks=[respawn]
    print(f"{tag()}: starting", flush=True)
    trainer.fit(model, loader)
    print(f"{tag()}: done at step {trainer.global_step} (resumed at {respawn.start})", flush=True)
    if args.weights_out and trainer.is_global_zero:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.weights_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
