"""What respawn.ckpt.lightning's callback costs a Lightning fit, against Lightning's own checkpointing in the same run.
`python -m bench.framework_lightning [--steps 40] [--every 10] [--step-ms 100] [--state-mb 100] [--json]`.

Two fits of the same model (MLP layers whose parameters and SGD momentum make --state-mb of checkpoint), one process
on the CPU, each step a --step-ms sleep beside the real forward/backward: the baseline with Lightning's
ModelCheckpoint(every_n_train_steps=--every), then Respawn(every=--every) instead. Each callback's
on_train_batch_end is timed on the training thread:
  step_ms_median               the whole step (batch end to batch end), baseline and Respawn, for scale
  respawn_us_between_saves     Respawn's hook at a step without a save (the notice check, the status file's step)
  overhead_ratio               that / --step-ms (goal <= 0.01)
  lightning_save_ms            ModelCheckpoint's blocking save (trainer.save_checkpoint), median over saves
  respawn_stall_ms             Respawn's periodic save on the training thread (the checkpoint dumped and its
                               tensors copied), median over saves; the write, checksum and commit follow on the
                               save's thread
  stall_ratio                  respawn_stall_ms / lightning_save_ms (goal <= 0.10)
In a multi-rank job the agreement's all-reduce comes on top of the per-step figure: bench.agreement measures it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def fit(args: argparse.Namespace, callback, folder: str) -> tuple[list[float], dict[int, float]]:
    """Train --steps steps with `callback`; returns the step times and the callback's hook time at each step."""
    import lightning as L
    import torch
    from torch.utils.data import TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    width = 1024
    layers = max(1, round(args.state_mb * 2**20 / (2 * 4 * width * width)))  # parameters and momentum, float32

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

        def training_step(self, batch, batch_idx):
            time.sleep(args.step_ms / 1000)
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4, momentum=0.9)

    hooks: dict[int, float] = {}
    ends: list[float] = []
    inner = callback.on_train_batch_end

    def timed(trainer, *a, **k):
        t0 = time.perf_counter()
        try:
            inner(trainer, *a, **k)
        finally:
            hooks[trainer.global_step] = time.perf_counter() - t0
            ends.append(time.perf_counter())

    callback.on_train_batch_end = timed  # Lightning looks the hook up on the instance
    L.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(64, width))
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback], default_root_dir=folder)
    trainer.fit(Model(), StatefulDataLoader(data, batch_size=4, shuffle=True))
    return [b - a for a, b in zip(ends, ends[1:])], hooks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.framework_lightning", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=100.0, help="the step body's sleep, beside the real compute")
    p.add_argument("--state-mb", type=float, default=100.0, help="the checkpoint's size (parameters and momentum)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    from lightning.pytorch.callbacks import ModelCheckpoint

    from respawn.ckpt.framework_files import FilesManager
    from respawn.ckpt.lightning import Respawn

    saves = set(range(args.every, args.steps, args.every))
    quiet = [s for s in range(2, args.steps) if s not in saves and s - 1 not in saves]  # no save's thread nearby
    with tempfile.TemporaryDirectory(prefix="respawn-bench-lightning-") as tmp:
        base_steps, base = fit(args, ModelCheckpoint(dirpath=os.path.join(tmp, "lightning"), save_top_k=-1,
                                                     every_n_train_steps=args.every), tmp)
        manager = FilesManager(local_dir=os.path.join(tmp, "respawn"), framework="lightning", keep=2)
        respawn = Respawn(every=args.every, manager=manager)
        ours_steps, ours = fit(args, respawn, tmp)
    between = statistics.median(ours[s] for s in quiet)
    lightning_save = statistics.median(base[s] for s in saves)
    stall = statistics.median(ours[s] for s in saves)
    result = {
        "steps": args.steps, "every": args.every, "step_ms": args.step_ms, "state_mb": args.state_mb,
        "step_ms_median": [round(statistics.median(times) * 1e3, 1) for times in (base_steps, ours_steps)],
        "respawn_us_between_saves": round(between * 1e6, 1),
        "overhead_ratio": round(between / (args.step_ms / 1000), 5),
        "lightning_save_ms": round(lightning_save * 1e3, 1),
        "respawn_stall_ms": round(stall * 1e3, 1),
        "stall_ratio": round(stall / lightning_save, 3),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>26}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
