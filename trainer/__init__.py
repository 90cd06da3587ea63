"""Respawn trainer library: checkpoints that survive preemption, for PyTorch and JAX.

Importing `respawn.ckpt` imports neither torch nor jax (see respawn.ckpt.torch_state / respawn.ckpt.jax_state for the
framework helpers). TrainingLoop runs the whole protocol around a `for` loop; CheckpointManager is the explicit API
underneath. Interface for the node agent: respawn.contract (read_status, EXIT_PREEMPTED), upload_pending. See
trainer/README.md.
"""

from __future__ import annotations

import importlib

# What the package exports, by the module that defines it: each imported on first use, so that importing a leaf
# (respawn.ckpt.checksum, as the agent's tools do) loads that leaf alone, not the manager and its stores.
_EXPORTS = {
    "CheckpointManager": ".manager",
    "DEFAULT_NOTICE_BUDGET_S": ".manager",
    "PREEMPTED_EXIT_CODE": ".manager",
    "Preempted": ".loop",
    "SaveOutcome": ".manager",
    "SaveState": ".manager",
    "TrainingLoop": ".loop",
    "collective_timeout": ".collectives",
    "plan_retention": ".retention",
    "read_status": "respawn.contract",
    "upload_pending": ".manager",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
