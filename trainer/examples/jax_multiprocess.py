"""A multi-process JAX trainer (jax.distributed, one process per host; here several processes on one machine, CPU
backend, gloo collectives): a data-parallel MLP whose first layer and its Adam moments are sharded over the
processes and the rest replicated, a replicated dropout key, NumPy-shuffled data. Every process runs the same
respawn.ckpt.TrainingLoop: a notice seen by any process stops all of them after the same step, each writes the
shards it holds, process 0 commits the step, and every process exits 75.

    python -m respawn.ckpt.examples.jax_multiprocess --coordinator 127.0.0.1:9876 --num-processes 2 --process-id 0
    python -m respawn.ckpt.examples.jax_multiprocess --coordinator 127.0.0.1:9876 --num-processes 2 --process-id 1

Under the node agent on a multi-host TPU slice no flag is needed: every worker's agent gives its trainer
RESPAWN_NODE_RANK (the worker's index: the process id), RESPAWN_NUM_NODES (the slice's workers: the process count)
and RESPAWN_MASTER_ADDR (worker 0's IP: the coordinator runs there, on COORDINATOR_PORT). A flag given wins. One
process (RESPAWN_NUM_NODES=1 or unset, no --coordinator) runs without jax.distributed.
"""

from __future__ import annotations

import argparse
import os
import sys

from respawn import contract
from respawn.ckpt.examples._common import N, next_batch, parse_args, progress

D_IN, HIDDEN, LR = 32, 64, 1e-3
# The port JAX's own Cloud TPU cluster detection puts the coordinator on (jax/_src/clusters/cloud_tpu_cluster.py,
# `coordinator_port = '8482'`, jax 0.10.2): the processes cannot agree on a port before the coordinator is up, so
# it is fixed, and using JAX's keeps a job the same whether it names the coordinator or lets JAX find it.
COORDINATOR_PORT = 8482
ENV_NODE_RANK, ENV_NUM_NODES, ENV_MASTER_ADDR = contract.ENV_NODE_RANK, contract.ENV_NUM_NODES, contract.ENV_MASTER_ADDR


def distributed_params(coordinator: str | None, num_processes: int | None, process_id: int | None,
                       env=os.environ) -> tuple[str | None, int, int]:
    """(coordinator, process count, process id): each flag given, else the node agent's environment. A single
    process without a coordinator gets (None, 1, 0): it runs without jax.distributed. On a real TPU VM
    `jax.distributed.initialize()` without arguments finds the same three itself (from the worker metadata,
    worker 0 on COORDINATOR_PORT); taking them from the agent makes them the same in the sim, where that detection
    does not run, and on a GPU VM."""
    def number(name: str, default: int) -> int:
        text = env.get(name, "").strip()
        if not text:
            return default
        if not text.isdigit():
            raise SystemExit(f"jax_multiprocess: {name} must be a non-negative integer, got {text!r}")
        return int(text)

    count = num_processes if num_processes is not None else number(ENV_NUM_NODES, 1)
    pid = process_id if process_id is not None else number(ENV_NODE_RANK, 0)
    if count < 1 or not 0 <= pid < count:
        raise SystemExit(f"jax_multiprocess: process id {pid} is not one of {count} process(es)")
    if coordinator is None and count > 1:
        master = env.get(ENV_MASTER_ADDR, "").strip()
        if not master:
            raise SystemExit(f"jax_multiprocess: {count} processes need a coordinator: give --coordinator HOST:PORT "
                             f"or run under the node agent ({ENV_MASTER_ADDR})")
        coordinator = f"{master}:{COORDINATOR_PORT}"
    return coordinator, count, pid


def main(argv=None) -> int:
    job = argparse.ArgumentParser(add_help=False)  # this example's own flags; the shared ones in parse_args
    job.add_argument("--coordinator", default=os.environ.get("JAX_COORDINATOR_ADDRESS"),
                     help=f"host:port of process 0 (default: ${ENV_MASTER_ADDR}:{COORDINATOR_PORT})")
    job.add_argument("--num-processes", type=int, default=None, help=f"default: ${ENV_NUM_NODES}, else 1")
    job.add_argument("--process-id", type=int, default=None, help=f"default: ${ENV_NODE_RANK}, else 0")
    job, rest = job.parse_known_args(argv)
    coordinator, processes, pid = distributed_params(job.coordinator, job.num_processes, job.process_id)
    name = f"jax_multiprocess[process {pid}]"
    args = parse_args("jax_multiprocess", rest)
    os.environ.setdefault("XLA_FLAGS",
                          f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={args.threads}")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from respawn.ckpt import TrainingLoop

    if coordinator is not None:
        # shutdown_timeout: at exit every process waits for the others; one that died must not hold the rest for
        # 5 min. The coordinator binds the address it is known by, not every interface (JAX's default [::]).
        jax.distributed.initialize(coordinator, processes, pid, coordinator_bind_address=coordinator,
                                   shutdown_timeout_seconds=20)
    print(f"jax_multiprocess: process {pid} of {processes} pid {os.getpid()}", flush=True)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_column, by_row = (NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "data")),
                                     NamedSharding(mesh, P("data")))

    rng = np.random.default_rng(args.seed + 1000)  # the same data on every process
    x = rng.standard_normal((N, D_IN), dtype=np.float32)
    y = np.sin(x @ rng.standard_normal((D_IN, 1), dtype=np.float32)) + 0.1 * rng.standard_normal((N, 1), np.float32)

    def init(key):
        sizes = [(D_IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)]
        keys = jax.random.split(key, len(sizes))
        params = [{"w": jax.random.normal(k, s) * (1.0 / np.sqrt(s[0])), "b": jnp.zeros(s[1])}
                  for k, s in zip(keys, sizes)]
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {"params": params, "opt": {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)},
                "key": jax.random.key(args.seed + 2)}

    # Layer 0's weight (and its moments) sharded over the processes, everything else replicated.
    layer_sharding = [{"w": by_column, "b": replicated}, {"w": replicated, "b": replicated},
                      {"w": replicated, "b": replicated}]
    shardings = {"params": layer_sharding, "opt": {"m": layer_sharding, "v": layer_sharding, "t": replicated},
                 "key": replicated}
    state = jax.jit(init, out_shardings=shardings)(jax.random.key(args.seed))

    def forward(params, xb, key):
        h = xb
        for i, layer in enumerate(params):
            h = h @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                h = jax.nn.relu(h)
                if i == 0:  # dropout 0.1, driven by the checkpointed key
                    h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0.0)
        return h

    def update(state, xb, yb):
        key, sub = jax.random.split(state["key"])
        params, opt = state["params"], state["opt"]
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((forward(p, xb, sub) - yb) ** 2))(params)
        t = opt["t"] + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], grads)
        mhat_c, vhat_c = 1 - 0.9 ** t, 1 - 0.999 ** t
        params = jax.tree_util.tree_map(lambda p, m, v: p - LR * (m / mhat_c) / (jnp.sqrt(v / vhat_c) + 1e-8),
                                        params, m, v)
        return {"params": params, "opt": {"m": m, "v": v, "t": t}, "key": key}, loss

    update = jax.jit(update, out_shardings=(shardings, replicated))
    shuffle = np.random.default_rng(args.seed + 1)
    data = {"epoch": 0, "pos": 0, "perm": shuffle.permutation(N)}  # the data position (restored in place)

    def batch(rows):  # the global batch, split over the processes by rows: each holds its own slice
        return jax.make_array_from_callback(rows.shape, by_row, lambda index: rows[index])

    def train_step(state):
        idx = next_batch(data, lambda: shuffle.permutation(N))
        state, loss = update(state, batch(x[idx]), batch(y[idx]))
        return state, float(loss.addressable_data(0))

    # TrainingLoop sees jax.distributed and checkpoints through ShardedCheckpointManager.from_env.
    with TrainingLoop(args.steps, every=args.checkpoint_every, state=state, data=data, shuffle=shuffle) as loop, \
            progress(name, args, loop) as report:
        for step in loop:
            loop.state, loss = train_step(loop.state)
            report(step, loss)

    if args.final_params:
        gathered = multihost_utils.process_allgather(loop.state["params"], tiled=True)
        if pid == 0:
            np.savez(args.final_params, **{f"{i}_{k}": v for i, layer in enumerate(gathered) for k, v in layer.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
