"""A small JAX MLP regression trainer (hand-written Adam, dropout with a checkpointed PRNG key, NumPy-shuffled
data) that resumes from the newest committed checkpoint and saves an emergency checkpoint on SIGTERM
(respawn.ckpt.TrainingLoop with an immutable state pytree).

    python -m respawn.ckpt.examples.jax_mlp --steps 300 --checkpoint-every 50 --state-mb 64
"""

from __future__ import annotations

import os
import sys

from respawn.ckpt.examples._common import N, next_batch, parse_args, progress

D_IN, HIDDEN, LR = 32, 64, 1e-3


def main(argv=None) -> int:
    args = parse_args("jax_mlp", argv)
    # Thread count must be fixed before jax starts its CPU client.
    os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={args.threads}")
    import jax
    import jax.numpy as jnp
    import numpy as np

    from respawn.ckpt import CheckpointManager, TrainingLoop

    data_key = jax.random.PRNGKey(args.seed + 1000)
    kx, kt, kn = jax.random.split(data_key, 3)
    x = jax.random.normal(kx, (N, D_IN))
    y = jnp.sin(x @ jax.random.normal(kt, (D_IN, 1))) + 0.1 * jax.random.normal(kn, (N, 1))

    def init(key):
        sizes = [(D_IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)]
        keys = jax.random.split(key, len(sizes))
        return [{"w": jax.random.normal(k, s) * (1.0 / np.sqrt(s[0])), "b": jnp.zeros(s[1])}
                for k, s in zip(keys, sizes)]

    def forward(params, xb, key):
        h = xb
        for i, layer in enumerate(params):
            h = h @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                h = jax.nn.relu(h)
                if i == 0:  # dropout 0.1, driven by the checkpointed key
                    keep = jax.random.bernoulli(key, 0.9, h.shape)
                    h = jnp.where(keep, h / 0.9, 0.0)
        return h

    @jax.jit
    def update(params, opt, key, xb, yb):
        key, sub = jax.random.split(key)
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((forward(p, xb, sub) - yb) ** 2))(params)
        t = opt["t"] + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], grads)
        mhat_c, vhat_c = 1 - 0.9 ** t, 1 - 0.999 ** t
        params = jax.tree_util.tree_map(lambda p, m, v: p - LR * (m / mhat_c) / (jnp.sqrt(v / vhat_c) + 1e-8),
                                        params, m, v)
        return params, {"m": m, "v": v, "t": t}, key, loss

    params = init(jax.random.PRNGKey(args.seed))
    state = {  # immutable: each step makes a new one
        "params": params,
        "opt": {"m": jax.tree_util.tree_map(jnp.zeros_like, params),
                "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.int32)},
        "key": jax.random.key(args.seed + 2),
        # Ballast: checkpointed, never updated (an in-jit update would copy it every step).
        "ballast": jnp.zeros(max(1, int(args.state_mb * (1 << 20)) // 4), jnp.float32),
    }
    shuffle = np.random.default_rng(args.seed + 1)
    data = {"epoch": 0, "pos": 0, "perm": shuffle.permutation(N)}  # the data position (restored in place)

    def train_step(state):
        idx = next_batch(data, lambda: shuffle.permutation(N))
        params, opt, key, loss = update(state["params"], state["opt"], state["key"], x[idx], y[idx])
        return {**state, "params": params, "opt": opt, "key": key}, float(loss)

    mgr = CheckpointManager.from_env(default_dir=args.checkpoint_dir, total_steps=args.steps, keep=args.keep)
    # loop.state is restored from the checkpoint (into `state`'s structure and shardings); data and shuffle in place.
    with TrainingLoop(args.steps, every=args.checkpoint_every, manager=mgr, state=state, data=data,
                      shuffle=shuffle) as loop, progress("jax_mlp", args, loop) as report:
        for step in loop:
            loop.state, loss = train_step(loop.state)
            report(step, loss)

    if args.final_params:
        flat = {f"{i}_{k}": np.asarray(v) for i, layer in enumerate(loop.state["params"]) for k, v in layer.items()}
        np.savez(args.final_params, **flat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
