"""Checkpoint benchmark: training-loop stall of an async periodic save, emergency flush throughput against the
raw disk, restore time. `python -m bench.checkpoint [--size-mb 1024] [--quick] [--json] [--dir DIR]`.

All figures come from the same run on the same disk (DIR, default a temp dir under the system temp dir):
  raw_write_MBps     sequential 8 MiB writes of SIZE bytes + fsync, interleaved with the emergency saves
                     (--repeats pairs) so that both see the same disk; shared disks are noisy
  sync_save_s        torch.save of the state to a file + fsync (what a naive trainer blocks for)
  stall_s            time the training loop is blocked by CheckpointManager.save (median of the saves after
                     the first; buffers are pre-faulted by prepare_snapshot; the first save is reported apart)
  stall_ratio        stall_s / sync_save_s                                  (goal <= 0.10)
  flush_vs_disk      median over the interleaved pairs of emergency-save throughput (to committed) / raw-write
                     throughput (goal >= 0.85)
  restore_seconds    CheckpointManager.restore of that state (verify checksums + read), page cache warm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench.disk import raw_write


def make_state(torch, size: int, n_tensors: int = 8) -> dict:
    per = size // n_tensors // 4
    g = torch.Generator().manual_seed(0)
    return {"model": {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(n_tensors)},
            "step": 0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    p.add_argument("--quick", action="store_true", help="64 MiB smoke run for CI")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp dir)")
    p.add_argument("--repeats", type=int, default=5, help="raw-write / emergency-save pairs (default 5)")
    p.add_argument("--saves", type=int, default=4, help="periodic saves to time (first one + steady state)")
    p.add_argument("--ranks", type=int, default=None,
                   help="distributed mode: N ranks (gloo, CPU) with FSDP2-sharded state, respawn's sharded save "
                        "against dcp.save / dcp.async_save (bench/checkpoint_distributed.py)")
    args = p.parse_args(argv)
    if args.ranks is not None:
        return _distributed(args)
    size_mb = 64 if args.quick else args.size_mb
    size = size_mb << 20

    import torch

    from respawn.ckpt import CheckpointManager

    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="respawn-bench-", dir=args.dir)
    try:
        state = make_state(torch, size)
        size = sum(t.numel() * 4 for t in state["model"].values())

        t0 = time.perf_counter()
        with open(os.path.join(work, "sync.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        sync_save_s = time.perf_counter() - t0
        os.remove(os.path.join(work, "sync.pt"))

        # A long budget: this measures throughput; the deadline path is covered by the tests.
        mgr = CheckpointManager(local_dir=os.path.join(work, "ckpt"), keep=1, notice_budget_s=3600)
        mgr.prepare_snapshot(state)  # what a trainer does after restore; allocation is off the loop
        mgr._prepare_thread.join()
        stalls, periodic_s = [], []
        for i in range(max(2, args.saves)):
            for t in state["model"].values():  # the loop mutates the state between saves
                t.add_(1.0)
            state["step"] = i + 1
            t0 = time.perf_counter()
            mgr.save(i + 1, state)
            stalls.append(time.perf_counter() - t0)
            mgr.wait()
            periodic_s.append(time.perf_counter() - t0)
        stall_first, stall_s = stalls[0], statistics.median(stalls[1:])

        raw_s, emergency_s = [], []
        for r in range(args.repeats):
            raw_s.append(size / raw_write(os.path.join(work, "raw.bin"), size) / 1e6)
            for t in state["model"].values():
                t.add_(1.0)
            mgr.clear_preemption()
            mgr.request_preemption("benchmark")
            t0 = time.perf_counter()
            outcome = mgr.emergency_save(1000 + r, state)
            emergency_s.append(time.perf_counter() - t0)
            if not outcome.committed:
                print(f"emergency save did not commit: {outcome}", file=sys.stderr)
                return 1
            if r + 1 < args.repeats:
                mgr.local.delete_step(1000 + r)
        last = 1000 + args.repeats - 1
        raw_mbps = size * len(raw_s) / sum(raw_s) / 1e6
        flush_mbps = size * len(emergency_s) / sum(emergency_s) / 1e6
        pair_ratios = [r / e for r, e in zip(raw_s, emergency_s)]
        fresh = CheckpointManager(local_dir=os.path.join(work, "ckpt"))
        t0 = time.perf_counter()
        step, restored = fresh.restore()
        restore_s = time.perf_counter() - t0
        assert step == last and torch.equal(restored["model"]["layer0.weight"], state["model"]["layer0.weight"])

        result = {
            "size_mb": size / (1 << 20), "raw_write_MBps": round(raw_mbps, 1),
            "raw_write_runs_MBps": [round(size / t / 1e6, 1) for t in raw_s],
            "emergency_runs_MBps": [round(size / t / 1e6, 1) for t in emergency_s],
            "sync_save_s": round(sync_save_s, 4), "stall_first_s": round(stall_first, 4),
            "stall_s": round(stall_s, 4), "stall_ratio": round(stall_s / sync_save_s, 4),
            "periodic_total_s": round(statistics.median(periodic_s[1:]), 4),
            "emergency_s": round(statistics.median(emergency_s), 4), "emergency_MBps": round(flush_mbps, 1),
            "flush_vs_disk": round(statistics.median(pair_ratios), 4),
            "flush_vs_disk_pairs": [round(x, 3) for x in pair_ratios], "restore_seconds": round(restore_s, 4),
            "cpus": os.cpu_count(), "dir": work,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        rows = [("state size", f"{result['size_mb']:.0f} MiB"),
                ("raw fsync'd sequential write", f"{result['raw_write_MBps']:.0f} MB/s (runs {result['raw_write_runs_MBps']})"),
                ("sync torch.save + fsync", f"{result['sync_save_s']:.3f} s"),
                ("async save: loop blocked (first)", f"{result['stall_first_s']:.3f} s"),
                ("async save: loop blocked (steady)", f"{result['stall_s']:.3f} s"),
                ("stall_ratio (goal <= 0.10)", f"{result['stall_ratio']:.3f}"),
                ("emergency save to committed", f"{result['emergency_s']:.3f} s, {result['emergency_MBps']:.0f} MB/s (runs {result['emergency_runs_MBps']})"),
                ("flush_vs_disk (goal >= 0.85)", f"{result['flush_vs_disk']:.3f} (pairs {result['flush_vs_disk_pairs']})"),
                ("restore (verify + load)", f"{result['restore_seconds']:.3f} s")]
        w = max(len(r[0]) for r in rows)
        for k, v in rows:
            print(f"{k:<{w}}  {v}")
    return 0


def _distributed(args) -> int:
    from bench import checkpoint_distributed as cd

    if args.ranks < 2:
        print("--ranks needs 2 or more", file=sys.stderr)
        return 2
    size_mb = 24 if args.quick else args.size_mb
    repeats, saves = (2, 3) if args.quick else (args.repeats, args.saves)
    result = cd.run(args.ranks, size_mb, saves, repeats, args.dir)
    print(json.dumps(result) if args.json else cd.table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
