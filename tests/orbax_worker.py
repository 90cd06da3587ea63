"""A JAX trainer with Orbax checkpoints under Respawn, for tests/test_integration_orbax.py and
bench/framework_orbax.py: a two-layer MLP (a dict of arrays: the first layer's weight sharded by columns over the
processes, the rest replicated), a hand-written SGD step, synthetic data drawn from the step's own seed (the data
position is the step).

    PYTHONPATH=. python tests/orbax_worker.py --steps 40 --every 10 [--processes 2] [--final-params OUT.npz]

--processes N starts N processes of a jax.distributed job on 127.0.0.1 (this process is their launcher, as torchrun
is: it passes the notice's SIGTERM to nobody, its process group gets it, and it exits 75 when every process did).
--dies-after STEP: process 1 is killed at the vote of the first save past step STEP (through the manager's
seam), after Orbax's own commit. Each process prints `orbax_worker[process P]: starting at step S`, and on the notice
`preempted at step S; OUTCOME; exiting 75`. --final-params: the parameters at the end (one process: also at the
stop).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from sim.emulators import free_port

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

D_IN, HIDDEN, BATCH, LR = 8, 16, 8, 0.05


def launch(args, argv) -> int:
    """Run the processes (one group with this one); 75 when all stopped on the notice, else the first failure."""
    port = free_port()  # the coordinator's, bound by process 0 once it starts
    signal.signal(signal.SIGTERM, lambda *_: None)  # the processes got it too: they decide, this one waits
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--coordinator", f"127.0.0.1:{port}",
                               "--process-id", str(p)]) for p in range(args.processes)]
    codes = [p.wait() for p in procs]
    failed = [c for c in codes if c not in (0, 75)]
    return failed[0] if failed else max(codes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--coordinator")
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--final-params")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--dies-after", type=int)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.processes > 1 and args.process_id is None:
        return launch(args, argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if args.processes > 1:
        jax.distributed.initialize(args.coordinator, args.processes, args.process_id,
                                   coordinator_bind_address=args.coordinator, shutdown_timeout_seconds=10)
    from respawn.ckpt import PREEMPTED_EXIT_CODE, Preempted
    from respawn.ckpt.framework_files import FilesManager
    from respawn.ckpt.orbax_ckpt import FRAMEWORK, OrbaxCheckpoints

    pid = jax.process_index()
    name = f"orbax_worker[process {pid}]"
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_column, by_row = (NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "data")),
                                     NamedSharding(mesh, P("data")))
    shardings = {"w1": by_column, "b1": replicated, "w2": replicated, "b2": replicated}

    def init():
        k1, k2 = jax.random.split(jax.random.key(0))
        return {"w1": jax.random.normal(k1, (D_IN, HIDDEN)) / np.sqrt(D_IN), "b1": jnp.zeros(HIDDEN),
                "w2": jax.random.normal(k2, (HIDDEN, 1)) / np.sqrt(HIDDEN), "b2": jnp.zeros(1)}

    def loss(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def sgd(p, x, y):
        return jax.tree.map(lambda w, g: w - LR * g, p, jax.grad(loss)(p, x, y))

    update = jax.jit(sgd, out_shardings=shardings)
    state = jax.jit(init, out_shardings=shardings)()

    def batch(step):  # the same global batch on every process, each holding its rows
        rng = np.random.default_rng(step)
        x = rng.standard_normal((BATCH, D_IN), dtype=np.float32)
        y = np.sin(x.sum(axis=1, keepdims=True))
        return [jax.make_array_from_callback(a.shape, by_row, lambda i, a=a: a[i]) for a in (x, y)]

    def save_params(path):
        gathered = multihost_utils.process_allgather(state, tiled=True) if args.processes > 1 else state
        if pid == 0:
            np.savez(path, **{k: np.asarray(v) for k, v in gathered.items()})

    manager = None
    if args.dies_after is not None:
        manager = FilesManager.from_env(framework=FRAMEWORK, total_steps=args.steps,
                                        seam=dies_at_vote(args.dies_after),
                                        **({} if pid == 0 else {"status_file": None}))
    try:
        with OrbaxCheckpoints(args.steps, args.every, manager=manager) as ckpt:
            start, state = ckpt.restore(state)
            print(f"{name}: starting at step {start}", flush=True)
            for step in range(start, args.steps):
                state = update(state, *batch(step))
                if args.step_seconds:
                    time.sleep(args.step_seconds)
                ckpt.save(step + 1, state)
    except Preempted as stop:
        print(f"{name}: threads left: {threads()}", flush=True)
        print(f"{name}: preempted at step {stop.outcome.step}; {stop.outcome.state.value}; exiting 75", flush=True)
        if args.final_params and args.processes == 1:
            save_params(args.final_params)
        if args.dies_after is not None:
            os._exit(PREEMPTED_EXIT_CODE)  # process 1 is gone: no jax.distributed shutdown barrier to wait out
        raise
    print(f"{name}: threads left: {threads()}", flush=True)
    if args.final_params:
        save_params(args.final_params)
    return 0


def threads() -> str:
    """The Python threads alive besides this one (none of Orbax's may outlive a save)."""
    import threading

    return ",".join(sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())) or "none"


def dies_at_vote(after: int):
    """The fault, through the manager's seam: process 1 is killed at the vote of the first save past step `after`,
    its Orbax files written and finalized (Orbax's own commit done), its vote never sent."""
    import jax

    from respawn.ckpt import commit
    from respawn.ckpt.jax_distributed import KeyValueSeam

    class Seam(KeyValueSeam):
        def all_gather(self, key, data, control=None):
            step = key.split("/")[2] if key.startswith("respawn/ckpt/") else ""
            if jax.process_index() == 1 and step.isdigit() and int(step) > after and key == commit.votes_key(int(step)):
                os._exit(9)
            return super().all_gather(key, data, control)

    return Seam()


if __name__ == "__main__":
    sys.exit(main())
