"""The private JAX API the multi-process checkpoint uses, in this one module: a JAX release that moves it fails
here, naming it (and tests/test_trainer_compat.py with it), rather than in the middle of a save."""

import jax

CHECKED_WITH = "jax==0.10.2"


def coordination_client():
    """The coordination service client jax.distributed.initialize connected (what multihost_utils uses too): the
    key-value store of the notice agreement and the checkpoint's commit. None before initialize."""
    try:
        from jax._src import distributed

        return distributed.global_state.client
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"respawn.ckpt.jax_compat: jax._src.distributed.global_state.client moved in jax "
                          f"{jax.__version__} ({exc}); it was checked with {CHECKED_WITH}: pin that version, or update "
                          "trainer/jax_compat.py") from exc
