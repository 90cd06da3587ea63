"""What respawn.ckpt.orbax_ckpt costs a JAX training loop against Orbax alone. `python -m bench.framework_orbax
[--mb 32] [--steps 60] [--every 20] [--step-ms 100] [--json]`.

One process (CPU backend), a state of --mb MiB of float32 arrays (random: nothing compresses), a loop of --steps
steps whose body is a --step-ms sleep, a save every --every steps, three ways in the same run:
  orbax blocking     ocp.StandardCheckpointer().save + wait_until_finished: Orbax's own blocking save (the baseline
                     of the stall)
  orbax manager      ocp.CheckpointManager(save_interval_steps=every).save(step, ...) at every step: Orbax's own
                     asynchronous saves, as an Orbax user writes the loop
  respawn            OrbaxCheckpoints.save(step, state) at every step: the notice check, and at every --every steps
                     the periodic save (Orbax's blocking part here, its write, the checksums and the commit on the
                     save's thread)
Figures (medians over the steps or saves):
  step_us_respawn / step_us_orbax_manager   the call on a step that does not save, in microseconds
  step_ratio                                step_us_respawn / step time (goal <= 0.01)
  stall_s_respawn / stall_s_orbax_manager   the call on a step that saves (the training thread's block)
  blocking_s                                Orbax's blocking save
  stall_ratio                               stall_s_respawn / blocking_s (goal <= 0.10)
  commit_s                                  a periodic save from its start to Respawn's commit (off the loop)
  overlapped                                saves that outlasted the interval to the next one (whose stall then
                                            includes waiting for it: give --every more steps)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")


def make_state(mb: int) -> dict:
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    n = mb * 2**20 // 4 // 4
    return {f"w{i}": jax.device_put(rng.standard_normal(n, dtype=np.float32)) for i in range(4)}


def orbax_blocking(state, root: str, saves: int) -> list[float]:
    import orbax.checkpoint as ocp

    times = []
    with ocp.StandardCheckpointer() as orbax:
        for i in range(saves):
            t0 = time.perf_counter()
            orbax.save(os.path.join(root, str(i)), state)
            orbax.wait_until_finished()
            times.append(time.perf_counter() - t0)
    return times


def loop(save, args) -> tuple[list[float], list[float]]:
    """(call times on steps that do not save, call times on steps that save)."""
    plain, saving = [], []
    for step in range(1, args.steps + 1):
        time.sleep(args.step_ms / 1000)
        t0 = time.perf_counter()
        save(step)
        (saving if step % args.every == 0 else plain).append(time.perf_counter() - t0)
    return plain, saving


def orbax_manager(state, root: str, args) -> tuple[list[float], list[float]]:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(save_interval_steps=args.every, max_to_keep=3)
    with ocp.CheckpointManager(root, options=options) as mngr:
        times = loop(lambda step: mngr.save(step, args=ocp.args.StandardSave(state)), args)
        mngr.wait_until_finished()
    return times


def respawn(state, root: str, args) -> tuple[list[float], list[float], list[float]]:
    from respawn.ckpt.framework_files import FilesManager
    from respawn.ckpt.orbax_ckpt import FRAMEWORK, OrbaxCheckpoints

    mgr = FilesManager(local_dir=root, framework=FRAMEWORK)
    commits = []
    original = mgr._write_and_ship

    def timed(step, kind, payload, control, retention):  # a periodic save's time from start to commit
        t0 = time.perf_counter()
        outcome = original(step, kind, payload, control, retention)
        commits.append(time.perf_counter() - t0 + started[step])
        assert outcome.committed, outcome
        return outcome

    started: dict[int, float] = {}
    mgr._write_and_ship = timed
    ckpt = OrbaxCheckpoints(args.steps * 10, args.every, manager=mgr, signals=())

    def save(step):
        t0 = time.perf_counter()
        ckpt.save(step, state)
        started[step] = time.perf_counter() - t0

    with ckpt:
        plain, saving = loop(save, args)
    assert len(commits) == args.steps // args.every, commits
    return plain, saving, commits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.framework_orbax", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=32, help="the state's size in MiB")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--step-ms", type=float, default=100.0, help="the step body's duration (a sleep)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    state = make_state(args.mb)
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="respawn-bench-orbax-") as tmp:
        blocking = orbax_blocking(state, os.path.join(tmp, "blocking"), max(args.steps // args.every, 1))
        m_plain, m_saving = orbax_manager(state, os.path.join(tmp, "manager"), args)
        r_plain, r_saving, commits = respawn(state, os.path.join(tmp, "respawn"), args)
    figures = {
        "mb": args.mb, "steps": args.steps, "every": args.every, "step_ms": args.step_ms,
        "load_average": round(os.getloadavg()[0], 1),
        "step_us_respawn": round(med(r_plain) * 1e6, 1), "step_us_orbax_manager": round(med(m_plain) * 1e6, 1),
        "step_ratio": round(med(r_plain) / (args.step_ms / 1000), 5) if args.step_ms else None,
        "stall_s_respawn": round(med(r_saving), 4), "stall_s_orbax_manager": round(med(m_saving), 4),
        "blocking_s": round(med(blocking), 4), "stall_ratio": round(med(r_saving) / med(blocking), 3),
        "commit_s": round(med(commits), 4),
        "overlapped": sum(c > args.every * args.step_ms / 1000 for c in commits[:-1]),
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"state {args.mb} MiB, {args.steps} steps of {args.step_ms:g} ms, a save every {args.every}; "
          f"load average {figures['load_average']}")
    print(f"  per step (no save):  respawn {figures['step_us_respawn']:.1f} us, orbax CheckpointManager "
          f"{figures['step_us_orbax_manager']:.1f} us; respawn / step {figures['step_ratio']:.3%} (goal <= 1 %)")
    print(f"  periodic save stall: respawn {figures['stall_s_respawn']:.3f} s, orbax CheckpointManager (async) "
          f"{figures['stall_s_orbax_manager']:.3f} s, orbax blocking save {figures['blocking_s']:.3f} s; "
          f"respawn / blocking {figures['stall_ratio']:.3f} (goal <= 0.10)")
    print(f"  periodic save to respawn's commit: {figures['commit_s']:.3f} s (off the loop); saves that outlasted "
          f"the interval: {figures['overlapped']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
