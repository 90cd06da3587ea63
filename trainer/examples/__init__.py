"""Runnable example trainers: `python -m respawn.ckpt.examples.torch_mlp` and `python -m respawn.ckpt.examples.jax_mlp`."""
