"""`python -m bench.checkpoint --ranks N`: the checkpoint benchmark for a multi-rank job on one node.

N ranks are spawned here (torch.multiprocessing, gloo on CPU, 1 thread per rank, a TCP rendezvous on a free
127.0.0.1 port). Each holds its FSDP2 shards (torch.distributed.fsdp.fully_shard) of a stack of Linear layers plus
their Adam state (exp_avg, exp_avg_sq): SIZE bytes in total over all ranks, a third of it parameters. All figures
come from the same run on the same disk (DIR):
  raw_write_MBps        rank 0 alone: sequential 8 MiB writes of SIZE bytes + fsync (the disk), interleaved with
                        the emergency saves (--repeats pairs)
  dcp_save_s            a blocking torch.distributed.checkpoint.save of the state (FileSystemWriter, fsync'd), every
                        rank; the job's time (the slowest rank), median of the saves after the first
  dcp_async_block_s     DCP's own async_save of the same state: the part that blocks the caller (the anchor)
  stall_s               the loop's blocked time in respawn's TorchShardedManager.save (the slowest rank; median of
                        the saves after the first; buffers allocated by prepare_snapshot)
  stall_ratio           stall_s / dcp_save_s                                      (goal <= 0.10)
  stall_vs_dcp_async    stall_s / dcp_async_block_s                               (goal <= 1: no worse than DCP)
  flush_vs_disk         median over the pairs of (emergency-save throughput, all ranks together: the step's total
                        bytes / time from the save's start to COMMITTED on every rank) / raw-write throughput
                        (goal >= 0.85)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import tempfile
import time

GOALS = {"stall_ratio": ("<=", 0.10), "stall_vs_dcp_async": ("<=", 1.0), "flush_vs_disk": (">=", 0.85)}
WIDTH = 1024  # Linear layers of WIDTH x WIDTH float32, no bias


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, work: str, size: int, saves: int, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import _init_optim_state, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from bench.disk import raw_write
    from respawn.ckpt import format as fmt
    from respawn.ckpt.torch_sharded import TorchShardedManager

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        layers = max(1, round(size / 3 / (WIDTH * WIDTH * 4)))
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        _init_optim_state(opt)  # Adam's exp_avg / exp_avg_sq exist now
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        local = [t.to_local() if hasattr(t, "to_local") else t
                 for t in list(model_sd.values()) + [v for s in optim_sd["state"].values() for v in s.values()]
                 if isinstance(t, torch.Tensor) and t.dim() > 0]
        my_bytes = sum(t.numel() * t.element_size() for t in local)

        def mutate():  # the loop changes the state between saves
            with torch.no_grad():
                for t in local:
                    t.add_(1.0)

        def job_max(x: float) -> float:  # the job waits for its slowest rank
            v = torch.tensor([x], dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            return float(v[0])

        n = max(2, saves)
        dcp_s, async_s, stalls, periodic_s = [], [], [], []
        for i in range(n):  # blocking DCP
            mutate()
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(work, f"dcp{i}"), sync_files=True))
            dcp_s.append(job_max(time.perf_counter() - t0))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(os.path.join(work, f"dcp{i}"))
        for i in range(n):  # DCP's own async_save: the blocking part
            mutate()
            dist.barrier()
            t0 = time.perf_counter()
            fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(os.path.join(work, f"async{i}"),
                                                                            sync_files=True))
            block = time.perf_counter() - t0
            fut.result()
            async_s.append(job_max(block))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(os.path.join(work, f"async{i}"))

        mgr = TorchShardedManager(local_dir=os.path.join(work, "ckpt"), keep=1, notice_budget_s=3600)
        mgr.prepare_snapshot(state)
        for i in range(n):  # respawn's periodic save
            mutate()
            dist.barrier()
            t0 = time.perf_counter()
            mgr.save(i + 1, state)
            stall = time.perf_counter() - t0
            outcome = mgr.wait()
            total = time.perf_counter() - t0
            if not outcome.committed:
                raise RuntimeError(f"periodic save did not commit: {outcome}")
            stalls.append(job_max(stall))
            periodic_s.append(job_max(total))

        raw_s, emergency_s, nbytes = [], [], 0
        for r in range(repeats):  # interleaved pairs: raw disk write, emergency save
            dist.barrier()
            raw = 0.0
            if rank == 0:
                raw = size / raw_write(os.path.join(work, "raw.bin"), size) / 1e6
            raw_s.append(job_max(raw))
            mutate()
            mgr.clear_preemption()
            mgr.request_preemption("benchmark")
            dist.barrier()
            t0 = time.perf_counter()
            outcome = mgr.emergency_save(1000 + r, state)
            emergency_s.append(job_max(time.perf_counter() - t0))
            if not outcome.committed:
                raise RuntimeError(f"emergency save did not commit: {outcome}")
            if rank == 0:
                nbytes = fmt.read_manifest(mgr.local.step_dir(1000 + r))["total_bytes"]
            dist.barrier()
            if rank == 0:
                mgr.local.delete_step(1000 + r)
        total_bytes = torch.tensor([my_bytes], dtype=torch.int64)
        dist.all_reduce(total_bytes)
        mgr.close()

        if rank == 0:
            state_bytes = int(total_bytes[0])
            raw_mbps = [size / t / 1e6 for t in raw_s]
            em_mbps = [nbytes / t / 1e6 for t in emergency_s]
            pairs = [e / r for e, r in zip(em_mbps, raw_mbps)]
            dcp_save, async_block = statistics.median(dcp_s[1:]), statistics.median(async_s[1:])
            stall = statistics.median(stalls[1:])
            result = {
                "ranks": world, "size_mb": round(state_bytes / (1 << 20), 1), "layers": layers, "width": WIDTH,
                "checkpoint_mb": round(nbytes / (1 << 20), 1),
                "raw_write_MBps": round(size * len(raw_s) / sum(raw_s) / 1e6, 1),
                "raw_write_runs_MBps": [round(x, 1) for x in raw_mbps],
                "dcp_save_s": round(dcp_save, 4), "dcp_save_runs_s": [round(x, 3) for x in dcp_s],
                "dcp_async_block_s": round(async_block, 4), "dcp_async_runs_s": [round(x, 3) for x in async_s],
                "stall_first_s": round(stalls[0], 4), "stall_s": round(stall, 4),
                "stall_ratio": round(stall / dcp_save, 4), "dcp_async_ratio": round(async_block / dcp_save, 4),
                "stall_vs_dcp_async": round(stall / async_block, 4),
                "periodic_total_s": round(statistics.median(periodic_s[1:]), 4),
                "emergency_s": round(statistics.median(emergency_s), 4),
                "emergency_MBps": round(nbytes * len(emergency_s) / sum(emergency_s) / 1e6, 1),
                "emergency_runs_MBps": [round(x, 1) for x in em_mbps],
                "flush_vs_disk": round(statistics.median(pairs), 4),
                "flush_vs_disk_pairs": [round(x, 3) for x in pairs],
                "cpus": os.cpu_count(), "backend": "gloo", "device": "cpu", "dir": work,
            }
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def run(ranks: int, size_mb: int, saves: int, repeats: int, dir: str | None) -> dict:
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = tempfile.mkdtemp(prefix="respawn-bench-", dir=dir)
    try:
        out = os.path.join(work, "result.json")
        mp.spawn(_rank_main, args=(ranks, _free_port(), work, size_mb << 20, saves, repeats, out), nprocs=ranks,
                 join=True)
        with open(out) as f:
            result = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["goals"] = {k: ("PASS" if (result[k] <= v if op == "<=" else result[k] >= v) else "MISS")
                       for k, (op, v) in GOALS.items()}
    return result


def table(result: dict) -> str:
    g = result["goals"]
    rows = [("ranks (gloo, CPU, 1 thread each)", f"{result['ranks']}"),
            ("state size (FSDP2 params + Adam)", f"{result['size_mb']:.0f} MiB ({result['layers']} x "
             f"Linear({result['width']}, {result['width']}); checkpoint {result['checkpoint_mb']:.0f} MiB)"),
            ("raw fsync'd sequential write", f"{result['raw_write_MBps']:.0f} MB/s (runs {result['raw_write_runs_MBps']})"),
            ("blocking dcp.save", f"{result['dcp_save_s']:.3f} s (runs {result['dcp_save_runs_s']})"),
            ("dcp.async_save: caller blocked", f"{result['dcp_async_block_s']:.3f} s (runs {result['dcp_async_runs_s']}),"
             f" {result['dcp_async_ratio']:.3f} of dcp.save"),
            ("respawn save: loop blocked (first)", f"{result['stall_first_s']:.3f} s"),
            ("respawn save: loop blocked (steady)", f"{result['stall_s']:.3f} s"),
            ("stall_ratio (goal <= 0.10)", f"{result['stall_ratio']:.3f}  {g['stall_ratio']}"),
            ("stall / dcp.async_save block (goal <= 1)", f"{result['stall_vs_dcp_async']:.3f}  {g['stall_vs_dcp_async']}"),
            ("emergency save to COMMITTED (all ranks)", f"{result['emergency_s']:.3f} s, {result['emergency_MBps']:.0f} MB/s"
             f" (runs {result['emergency_runs_MBps']})"),
            ("flush_vs_disk (goal >= 0.85)", f"{result['flush_vs_disk']:.3f} (pairs {result['flush_vs_disk_pairs']})  "
             f"{g['flush_vs_disk']}")]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
