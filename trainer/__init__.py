"""Respawn trainer library: checkpoints that survive preemption, for PyTorch and JAX.

Importing `trainer` imports neither torch nor jax (see respawn.ckpt.torch_state / respawn.ckpt.jax_state for the
framework helpers). Interface for the node agent: respawn.ckpt.status.read_status, trainer.upload_pending,
trainer.PREEMPTED_EXIT_CODE. See trainer/README.md.
"""

from .manager import (
    DEFAULT_NOTICE_BUDGET_S,
    PREEMPTED_EXIT_CODE,
    CheckpointManager,
    plan_retention,
    upload_pending,
)
from respawn.contract import read_status

__all__ = [
    "CheckpointManager",
    "DEFAULT_NOTICE_BUDGET_S",
    "PREEMPTED_EXIT_CODE",
    "plan_retention",
    "read_status",
    "upload_pending",
]
