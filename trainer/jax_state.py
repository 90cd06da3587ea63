"""JAX helpers. A JAX training state is already a pytree (parameters, optimizer state, PRNG key, data
position); CheckpointManager stores its leaves as raw arrays. These helpers put restored leaves back where a
template pytree wants them (its tree structure, and each leaf's sharding when it has one)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def to_template(restored: Any, template: Any) -> Any:
    """Re-shape `restored` into `template`'s tree structure (custom pytree nodes included) and place each leaf
    like the template's leaf (same sharding/device when it is a jax.Array)."""
    new_leaves = jax.tree_util.tree_leaves(restored)
    tmpl_leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(new_leaves) != len(tmpl_leaves):
        raise ValueError(f"checkpoint has {len(new_leaves)} leaves, the template {len(tmpl_leaves)}: "
                         "the model or optimizer changed since the checkpoint was written")
    placed = []
    for new, old in zip(new_leaves, tmpl_leaves):
        if isinstance(old, jax.Array) and isinstance(new, (jax.Array, np.ndarray)) and hasattr(old, "sharding"):
            if jax.dtypes.issubdtype(old.dtype, jax.dtypes.prng_key):
                placed.append(new)
            else:
                placed.append(jax.device_put(new, old.sharding))
        else:
            placed.append(new)
    return jax.tree_util.tree_unflatten(treedef, placed)
