"""Per-step cost of the notice agreement in a multi-process JAX job (respawn.ckpt.jax_distributed.JaxJob.agree_notice:
one jitted int32 MAX over a mesh of one device per process). `python -m bench.jax_agreement [--processes 2]
[--steps 100] [--step-ms 100] [--json]`.

Each process (jax.distributed on 127.0.0.1, CPU backend, gloo collectives, one thread) runs --steps steps: a
--step-ms sleep (the step body), a barrier (what a data-parallel step's gradient all-reduce does: the processes
reach the boundary together; not timed), then the timed agreement, as TrainingLoop calls it at every step boundary
with no notice pending. The figures are those of bench.agreement (torch, gloo), so the two compare:
  agree_us_median / agree_us_p90 / agree_us_max   over the steps of every process, in microseconds
  overhead_ratio                                  agree_us_median / step time (goal <= 0.01; none at --step-ms 0)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from bench.agreement import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _process(pid: int, args: argparse.Namespace, coordinator: str, out: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    import jax
    from jax.experimental import multihost_utils

    from respawn.ckpt import CheckpointManager
    from respawn.ckpt.jax_distributed import JaxJob

    jax.distributed.initialize(coordinator, args.processes, pid)
    job = JaxJob()
    with tempfile.TemporaryDirectory(prefix="respawn-bench-agree-") as tmp:
        mgr = CheckpointManager(local_dir=tmp)
        times = []
        for _ in range(args.steps):
            time.sleep(args.step_ms / 1000)
            multihost_utils.sync_global_devices("step")
            t0 = time.perf_counter()
            stop = job.agree_notice(mgr)
            times.append(time.perf_counter() - t0)
            assert not stop
    with open(f"{out}.{pid}", "w") as f:
        json.dump(times, f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jax_agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=100.0, help="the step body's duration (a sleep)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--process", type=int, help=argparse.SUPPRESS)  # internal: run one process of the job
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.process is not None:
        _process(args.process, args, args.coordinator, args.out)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    with tempfile.TemporaryDirectory(prefix="respawn-bench-agree-") as tmp:
        out = os.path.join(tmp, "times")
        own = ["--processes", str(args.processes), "--steps", str(args.steps), "--step-ms", str(args.step_ms),
               "--coordinator", coordinator, "--out", out]
        env = dict(os.environ, PYTHONPATH=ROOT)
        procs = [subprocess.Popen([sys.executable, "-m", "bench.jax_agreement", *own, "--process", str(i)], env=env,
                                  stdout=subprocess.DEVNULL) for i in range(args.processes)]
        if any(proc.wait() for proc in procs):
            raise SystemExit("a process of the benchmark failed; see its output above")
        report(out, args.processes, {"processes": args.processes, "steps": args.steps, "step_ms": args.step_ms},
               args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
