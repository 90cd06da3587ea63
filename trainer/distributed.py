"""A multi-rank job in TrainingLoop (torch.distributed initialized with world_size > 1, e.g. under torchrun):
the notice agreement, rank 0 as the only writer, the same restore on every rank.

- Notice agreement: at every step boundary one MAX all-reduce of "milliseconds since this rank's notice, or -1",
  so that a notice seen by any rank stops every rank after the same step, with the deadline of the earliest notice.
- Replicated (DDP) state: rank 0 writes every checkpoint in the single-process format (its atomic commit marker
  is the job's commit); after an emergency or final save the other ranks receive its outcome.
- Restore: rank 0 restores first; the others then restore exactly the step it restored.
- Sharded state (DTensor parameters: FSDP2, tensor parallel): every rank saves its shards through DCP and rank 0
  commits once all are durable; every rank loads the step rank 0 verified (respawn.ckpt.torch_sharded).

loop.py calls current_job() only; nothing here runs, and torch is not imported, in a single-process job.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any, Callable

from . import _log
from .manager import CheckpointManager, SaveOutcome, SaveState

_STATES = list(SaveState)
_DURABLE = [None, "local", "remote"]


def current_job() -> "Job | None":
    """The job this process is a rank of, or None for a single process (neither torch.distributed nor
    jax.distributed initialized with more than one member)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return Job()
    if sys.modules.get("jax") is not None:
        from .jax_distributed import current_job as jax_job  # one process per host: respawn.ckpt.jax_distributed

        return jax_job()
    return None


class Job:
    """This rank's side of the protocol. Every rank must make the same calls in the same order (collectives)."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # The agreement runs at every step: on gloo (CPU tensors) so that an NCCL job does not synchronize its GPU
        # stream per step. new_group is itself collective: every rank builds its TrainingLoop.
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        self._age = torch.zeros(1, dtype=torch.int64)
        self.sharded: dict[str, Any] | None = None  # the loop's objects, when they hold sharded parameters

    @property
    def writer(self) -> bool:
        """Whether this rank saves: rank 0 alone for replicated state; every rank, its own shards, for sharded."""
        return self.rank == 0 or self.sharded is not None

    def default_manager(self, total_steps: int) -> CheckpointManager:
        if self.sharded is not None:
            from .torch_sharded import TorchShardedManager

            return TorchShardedManager.from_env(total_steps=total_steps)
        return CheckpointManager.from_env(total_steps=total_steps)

    def check_replicated(self, objects: dict[str, Any]) -> None:
        """Replicated (DDP) state is saved by rank 0; DTensor parameters (FSDP2's fully_shard, tensor parallel) make
        the state sharded: every rank saves its shards through DCP (respawn.ckpt.torch_sharded). FSDP1's wrapper
        is refused: its state_dict() is not DTensors, so rank 0's copy would be a wrong checkpoint."""
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
        from torch.nn import Module

        modules = {name: obj for name, obj in objects.items() if isinstance(obj, Module)}
        for name, module in modules.items():
            if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
                raise TypeError(
                    f"TrainingLoop: {name}= is wrapped in FSDP1 (FullyShardedDataParallel), which is not supported: "
                    "shard it with FSDP2 (torch.distributed.fsdp.fully_shard), whose DTensor state every rank "
                    "saves, or use DDP.")
        if any(isinstance(p, DTensor) for module in modules.values() for p in module.parameters()):
            self.sharded = objects

    def agree_notice(self, manager: CheckpointManager) -> bool:
        """Whether any rank has seen a notice; on True every rank's manager holds the earliest notice's time.
        Milliseconds since the notice rather than its time: monotonic clocks differ between hosts, ages do not."""
        seen = manager.preemption_requested
        now = time.monotonic()
        self._age[0] = int((now - manager.notice_at) * 1000) if seen else -1
        self._dist.all_reduce(self._age, op=self._dist.ReduceOp.MAX, group=self.group)
        age_ms = int(self._age[0])
        if age_ms < 0:
            return False
        if not seen:
            manager.request_preemption("notice seen by another rank", notice_at=now - age_ms / 1000)
            _log.warning("preemption notice seen by another rank; emergency checkpoint at this step boundary",
                         rank=self.rank, seconds_since_notice=age_ms / 1000)
        return True

    def restore(self, manager: CheckpointManager) -> tuple[int, Any] | None:
        """Every rank restores the step rank 0 restored. Each rank reads the files itself, after rank 0 (which
        may first have downloaded the step into the node's local directory): every rank needs all of the
        replicated state, and N ranks reading it from the node's page cache is cheaper than broadcasting all of
        it through the process group, which would also hold a second copy of it on rank 0. Sharded state: every
        rank loads its shards of the step rank 0 verified (respawn.ckpt.torch_sharded)."""
        if self.sharded is not None:
            from .torch_sharded import TorchShardedManager

            if not isinstance(manager, TorchShardedManager):
                raise TypeError("TrainingLoop: sharded (DTensor) parameters need a respawn.ckpt.torch_sharded."
                                "TorchShardedManager on every rank: pass manager=TorchShardedManager.from_env(...), "
                                "or no manager=")
            manager.attach()
            return manager.restore_sharded(self.sharded, self._broadcast_step)
        restored = manager.restore() if self.rank == 0 else None
        step = self._broadcast_step(restored[0] if restored is not None else -1)
        if self.rank == 0 or step < 0:
            return restored
        restored = manager.restore(step=step)
        if restored is None:
            raise RuntimeError(f"rank {self.rank} cannot restore step {step}, which rank 0 restored; see the "
                               "warnings above (a multi-rank job needs every rank to read the same checkpoint)")
        return restored

    def _broadcast_step(self, step: int) -> int:
        """Rank 0's step (-1: none) on every rank."""
        message = self._torch.tensor([step], dtype=self._torch.int64)
        self._dist.broadcast(message, src=0, group=self.group)
        return int(message[0])

    def save_outcome(self, step: int, save: Callable[[], SaveOutcome | None],
                     deadline: float | None) -> SaveOutcome:
        """Rank 0 runs `save` (every rank, when the state is sharded) and sends its outcome; the other ranks
        receive it, waiting until `deadline` (time.monotonic(); None: as long as it takes). A rank that does not
        hear in time reports the step as abandoned for itself; whether it committed is rank 0's marker alone,
        never a torn step."""
        message = self._torch.full((2,), -1, dtype=self._torch.int64)
        outcome = None
        if self.writer:
            outcome = save() or SaveOutcome(SaveState.FAILED, step, reason="the save thread died")
        if self.rank == 0:
            message[0], message[1] = _STATES.index(outcome.state), _DURABLE.index(outcome.durable)
        work = self._dist.broadcast(message, src=0, group=self.group, async_op=True)
        try:
            if deadline is None:
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError as exc:  # gloo's timeout, or a peer that is gone
            if self.rank == 0:
                _log.warning("could not tell the other ranks the save's outcome", step=step, error=str(exc))
                return outcome
            _log.error("no outcome from rank 0 in time; the step is committed only if rank 0's marker is",
                       step=step, rank=self.rank, error=str(exc))
            return SaveOutcome(SaveState.ABANDONED, step, reason=f"rank 0's outcome not received in time: {exc}")
        if self.rank == 0:
            return outcome
        state, durable = _STATES[int(message[0])], _DURABLE[int(message[1])]
        return SaveOutcome(state, step, durable, None if state is SaveState.COMMITTED else f"rank 0's save {state}")
