"""Per-step cost of the notice agreement in a multi-rank job (respawn.ckpt.distributed.TorchJob.agree_notice: one int64
MAX all-reduce on gloo). `python -m bench.agreement [--ranks 2] [--steps 100] [--step-ms 100] [--json]`.

Each rank (torch.multiprocessing, gloo on 127.0.0.1, one thread) runs --steps steps: a --step-ms sleep (the step
body), a barrier (what a DDP step's gradient all-reduce does: the ranks reach the boundary together; not timed),
then the timed agreement, as TrainingLoop calls it at every step boundary with no notice pending.
  agree_us_median / agree_us_p90 / agree_us_max   over the steps of every rank, in microseconds
  overhead_ratio                                  agree_us_median / step time (goal <= 0.01; none at --step-ms 0)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time


def _rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from respawn.ckpt import CheckpointManager
    from respawn.ckpt.distributed import TorchJob

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    job = TorchJob({})
    with tempfile.TemporaryDirectory(prefix="respawn-bench-agree-") as tmp:
        mgr = CheckpointManager(local_dir=tmp)
        times = []
        for _ in range(args.steps):
            time.sleep(args.step_ms / 1000)
            dist.barrier()
            t0 = time.perf_counter()
            stop = job.agree_notice(mgr)
            times.append(time.perf_counter() - t0)
            assert not stop
    with open(f"{out}.{rank}", "w") as f:
        json.dump(times, f)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=100.0, help="the step body's duration (a sleep)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="respawn-bench-agree-") as tmp:
        out = os.path.join(tmp, "times")
        mp.spawn(_rank, args=(args, port, out), nprocs=args.ranks)
        report(out, args.ranks, {"ranks": args.ranks, "steps": args.steps, "step_ms": args.step_ms}, args.json)
    return 0


def report(out: str, members: int, head: dict, as_json: bool) -> None:
    """Read each member's timings (`{out}.{i}`, a JSON list of seconds; the first is set-up: connections, or
    compilation) and print the agreement's statistics after `head` (which has the step time, `step_ms`)."""
    times = []
    for i in range(members):
        with open(f"{out}.{i}") as f:
            times += json.load(f)[1:]
    us = sorted(t * 1e6 for t in times)
    step_ms = head["step_ms"]
    result = {**head, "agree_us_median": round(statistics.median(us), 1),
              "agree_us_p90": round(us[int(0.9 * len(us))], 1), "agree_us_max": round(us[-1], 1),
              "overhead_ratio": round(statistics.median(us) / (step_ms * 1000), 5) if step_ms else None}
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>16}  {value}")


if __name__ == "__main__":
    sys.exit(main())
