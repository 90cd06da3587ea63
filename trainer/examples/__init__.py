"""Runnable example trainers: `python -m trainer.examples.torch_mlp` and `python -m trainer.examples.jax_mlp`."""
