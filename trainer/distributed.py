"""A multi-rank job in TrainingLoop (torch.distributed initialized with world_size > 1, e.g. under torchrun):
the notice agreement, rank 0 as the only writer, the same restore on every rank.

- Notice agreement: at every step boundary one MAX all-reduce of "milliseconds since this rank's notice, or -1",
  so that a notice seen by any rank stops every rank after the same step, with the deadline of the earliest notice.
- Replicated (DDP) state: rank 0 writes every checkpoint in the single-process format (its atomic commit marker
  is the job's commit); after an emergency or final save the other ranks receive its outcome.
- Restore: rank 0 restores first; the others then restore exactly the step it restored.

Sharded state (FSDP, DTensor parameters) is refused with an error: each rank would hold a different part of it.
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

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def default_manager(self, total_steps: int) -> CheckpointManager:
        return CheckpointManager.from_env(total_steps=total_steps)

    def check_replicated(self, objects: dict[str, Any]) -> None:
        """Refuse state that differs between ranks by construction: rank 0's copy would be a wrong checkpoint."""
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
        from torch.nn import Module

        for name, obj in objects.items():
            if not isinstance(obj, Module):
                continue
            sharded = any(isinstance(m, FullyShardedDataParallel) for m in obj.modules()) or any(
                isinstance(p, DTensor) for p in obj.parameters())
            if sharded:
                raise NotImplementedError(
                    f"TrainingLoop: {name}= holds sharded parameters (FSDP / DTensor). A multi-rank job is "
                    "checkpointed from rank 0's replicated (DDP) state; sharded state is not supported yet "
                    "(issue 15). Use DDP, or checkpoint this model yourself with torch.distributed.checkpoint.")

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
        it through the process group, which would also hold a second copy of it on rank 0."""
        restored = manager.restore() if self.writer else None
        step = self._torch.tensor([restored[0] if restored is not None else -1], dtype=self._torch.int64)
        self._dist.broadcast(step, src=0, group=self.group)
        step = int(step[0])
        if self.writer or step < 0:
            return restored
        restored = manager.restore(step=step)
        if restored is None:
            raise RuntimeError(f"rank {self.rank} cannot restore step {step}, which rank 0 restored; see the "
                               "warnings above (a multi-rank job needs every rank to read the same checkpoint)")
        return restored

    def save_outcome(self, step: int, save: Callable[[], SaveOutcome | None],
                     deadline: float | None) -> SaveOutcome:
        """Rank 0 runs `save` and sends its outcome; the other ranks receive it, waiting until `deadline`
        (time.monotonic(); None: as long as it takes). A rank that does not hear in time reports the step as
        abandoned for itself; whether it committed is rank 0's marker alone, never a torn step."""
        message = self._torch.full((2,), -1, dtype=self._torch.int64)
        outcome = None
        if self.writer:
            outcome = save() or SaveOutcome(SaveState.FAILED, step, reason="the save thread died")
            message[0], message[1] = _STATES.index(outcome.state), _DURABLE.index(outcome.durable)
        work = self._dist.broadcast(message, src=0, group=self.group, async_op=True)
        try:
            if deadline is None:
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError as exc:  # gloo's timeout, or a peer that is gone
            if self.writer:
                _log.warning("could not tell the other ranks the save's outcome", step=step, error=str(exc))
                return outcome
            _log.error("no outcome from rank 0 in time; the step is committed only if rank 0's marker is",
                       step=step, rank=self.rank, error=str(exc))
            return SaveOutcome(SaveState.ABANDONED, step, reason=f"rank 0's outcome not received in time: {exc}")
        if self.writer:
            return outcome
        state, durable = _STATES[int(message[0])], _DURABLE[int(message[1])]
        return SaveOutcome(state, step, durable, None if state is SaveState.COMMITTED else f"rank 0's save {state}")
