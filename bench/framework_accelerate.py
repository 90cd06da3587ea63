"""Accelerate integration benchmark (respawn.ckpt.accelerate): what RespawnAccelerate costs a custom loop, against
the same loop with Accelerate alone, measured in the same run. `python -m bench.framework_accelerate [--size-mb 128]
[--steps 3000] [--saves 4] [--batch 16] [--quick] [--json] [--dir DIR]`. One process (CPU); the multi-rank agreement's all-reduce
per step is bench.agreement's figure.

  step_plain_us      a step of `for batch in loader` with an empty body (median over --repeats passes)
  step_respawn_us    the same step through `run.steps(loader)` (notice check, status report, data position)
  overhead_pct       (step_respawn_us - step_plain_us) / 100 ms                          (goal <= 1 %)
  save_state_s       accelerator.save_state(dir) of an MLP of SIZE MiB with AdamW (3 x SIZE on disk): the blocking
                     save a plain loop waits for, into the page cache (median of --saves)
  save_state_fsync_s the same save with its files fsynced: on the disk, as Respawn's commit leaves a step
  stall_s            the training thread's time in RespawnAccelerate's periodic save (small files written, buffers
                     copied; the parameters and optimizer state copied on a thread, written, checksummed, committed
                     off the thread), plus what the next step's optimizer step waited for that copy (median of the
                     saves after the first)
  forward_backward_s the next step's forward and backward (a batch of --batch): the window the copy overlaps
  forward_backward_quiet_s  the same with no copy beside it: the difference is what the copy's share of the
                     cores and memory bandwidth costs the step on a CPU (on a GPU the copy is a DMA transfer)
  stall_ratio        stall_s / save_state_fsync_s (bench.checkpoint's baseline: a save on the disk) (goal <= 0.10)
  stall_vs_page_cache stall_s / save_state_s: on a CPU both are a copy of the state in memory
  copy_floor_s       one copy_ of the same tensors into buffers already faulted in: the least any in-memory
                     snapshot stalls on this machine (median of the copies after the first)
  emergency_s        the emergency save of that state (save_state, checksums, vote, COMMITTED), against the
                     notice budget
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time


def model_of(torch, size_mb: int):
    width = 1024
    layers = max(1, size_mb * (1 << 20) // (4 * width * width))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def fsync_all(folder: str) -> None:
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def step_costs(torch, accelerator, steps: int, repeats: int, folder: str) -> tuple[float, float]:
    from respawn.ckpt.accelerate import RespawnAccelerate
    from respawn.ckpt.framework_files import FilesManager

    data = torch.utils.data.TensorDataset(torch.arange(steps, dtype=torch.float32))
    loader = accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=1))
    plain, respawn = [], []
    for rep in range(repeats):
        t0 = time.perf_counter()
        for _ in loader:
            pass
        plain.append((time.perf_counter() - t0) / steps)
        mgr = FilesManager(local_dir=os.path.join(folder, f"steps{rep}"), framework="accelerate")
        run = RespawnAccelerate(accelerator, steps, every=0, manager=mgr, signals=())
        t0 = time.perf_counter()
        for step, _ in run.steps(loader):
            if step == steps - 1:  # leaving before the final save, which is no step's cost
                break
        respawn.append((time.perf_counter() - t0) / steps)
    return statistics.median(plain) * 1e6, statistics.median(respawn) * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.framework_accelerate", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=128, help="model size in MiB (default 128)")
    p.add_argument("--steps", type=int, default=3000, help="steps per pass of the per-step cost (default 3000)")
    p.add_argument("--repeats", type=int, default=5, help="passes of the per-step cost (default 5)")
    p.add_argument("--saves", type=int, default=4, help="saves timed, each way (default 4)")
    p.add_argument("--batch", type=int, default=16, help="the batch of the step after each save (default 16)")
    p.add_argument("--quick", action="store_true", help="16 MiB, 500 steps: a smoke run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp dir)")
    args = p.parse_args(argv)
    if args.quick:
        args.size_mb, args.steps, args.repeats, args.saves = 16, 500, 3, 3
    import torch
    from accelerate import Accelerator

    from respawn.ckpt.accelerate import RespawnAccelerate
    from respawn.ckpt.framework_files import FilesManager

    torch.manual_seed(0)
    folder = tempfile.mkdtemp(prefix="respawn-bench-accelerate-", dir=args.dir)
    try:
        accelerator = Accelerator(cpu=True)
        plain_us, respawn_us = step_costs(torch, accelerator, args.steps, args.repeats, folder)

        model = model_of(torch, args.size_mb)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, optimizer = accelerator.prepare(model, optimizer)
        model(torch.randn(2, 1024)).sum().backward()
        optimizer.step()  # AdamW's moments exist: the optimizer file is 2 x SIZE
        sync, synced = [], []
        for i in range(args.saves):
            where = os.path.join(folder, f"plain{i}")
            t0 = time.perf_counter()
            accelerator.save_state(where)
            sync.append(time.perf_counter() - t0)
            fsync_all(where)
            synced.append(time.perf_counter() - t0)
            shutil.rmtree(where)
        # The floor of any snapshot on this machine: one copy of the same tensors into buffers already faulted in.
        tensors = [t for t in accelerator.get_state_dict(model, unwrap=False).values()] + [
            t for state in optimizer.state_dict()["state"].values() for t in state.values() if t.dim()]
        buffers = [torch.empty_like(t) for t in tensors]
        floors = []
        for _ in range(args.saves):
            t0 = time.perf_counter()
            for buf, t in zip(buffers, tensors):
                buf.copy_(t)
            floors.append(time.perf_counter() - t0)
        del buffers
        mgr = FilesManager(local_dir=os.path.join(folder, "saves"), framework="accelerate", keep=2)
        run = RespawnAccelerate(accelerator, 10 * args.saves, every=1, manager=mgr, signals=())
        stalls, passes, batch = [], [], torch.randn(args.batch, 1024)
        quiet = []  # the same forward and backward with no copy beside it
        for _ in range(args.saves):
            t0 = time.perf_counter()
            accelerator.backward(model(batch).square().mean())
            quiet.append(time.perf_counter() - t0)
            optimizer.zero_grad()
        for i in range(1, args.saves + 1):
            blocked = run._buffers.blocked_s
            t0 = time.perf_counter()
            mgr.save(i, run._periodic_files())  # what the loop runs at a periodic step
            stalls.append(time.perf_counter() - t0)
            # The next step, as the loop runs it: its optimizer step waits for the parameters' copy if not done.
            t0 = time.perf_counter()
            accelerator.backward(model(batch).square().mean())
            passes.append(time.perf_counter() - t0)
            optimizer.step()
            optimizer.zero_grad()
            stalls[-1] += run._buffers.blocked_s - blocked
            outcome = mgr.wait()
            assert outcome is not None and outcome.committed, outcome
        t0 = time.perf_counter()
        emergency = mgr.emergency_save(args.saves + 1, run._files())
        emergency_s = time.perf_counter() - t0
        assert emergency.committed, emergency
        mgr.close()
        save_state_s = statistics.median(sync)
        stall_s = statistics.median(stalls[1:] or stalls)
        figures = {
            "size_mb": args.size_mb, "steps": args.steps,
            "step_plain_us": round(plain_us, 1), "step_respawn_us": round(respawn_us, 1),
            "overhead_pct": round((respawn_us - plain_us) / 1e5 * 100, 4),
            "save_state_s": round(save_state_s, 4), "save_state_fsync_s": round(statistics.median(synced), 4),
            "stall_first_s": round(stalls[0], 4), "stall_s": round(stall_s, 4),
            "stall_ratio": round(stall_s / statistics.median(synced), 3),
            "stall_vs_page_cache": round(stall_s / save_state_s, 3),
            "copy_floor_s": round(statistics.median(floors[1:] or floors), 4),
            "forward_backward_s": round(statistics.median(passes), 4),
            "forward_backward_quiet_s": round(statistics.median(quiet), 4),
            "emergency_s": round(emergency_s, 4), "notice_budget_s": mgr.notice_budget_s,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:20s} {value}")
        print(f"goals: overhead_pct <= 1 ({'met' if figures['overhead_pct'] <= 1 else 'MISSED'}), "
              f"stall_ratio <= 0.10 ({'met' if figures['stall_ratio'] <= 0.10 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
