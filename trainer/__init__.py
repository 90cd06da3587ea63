"""Respawn trainer library: checkpoints that survive preemption, for PyTorch and JAX.

Importing `respawn.ckpt` imports neither torch nor jax (see respawn.ckpt.torch_state / respawn.ckpt.jax_state for the
framework helpers). TrainingLoop runs the whole protocol around a `for` loop; CheckpointManager is the explicit API
underneath. Interface for the node agent: respawn.contract (read_status, EXIT_PREEMPTED), upload_pending. See
trainer/README.md.
"""

from .collectives import collective_timeout
from .loop import Preempted, TrainingLoop
from .manager import (
    DEFAULT_NOTICE_BUDGET_S,
    PREEMPTED_EXIT_CODE,
    CheckpointManager,
    SaveOutcome,
    SaveState,
    plan_retention,
    upload_pending,
)
from respawn.contract import read_status

__all__ = [
    "CheckpointManager",
    "DEFAULT_NOTICE_BUDGET_S",
    "PREEMPTED_EXIT_CODE",
    "Preempted",
    "SaveOutcome",
    "SaveState",
    "TrainingLoop",
    "collective_timeout",
    "plan_retention",
    "read_status",
    "upload_pending",
]
