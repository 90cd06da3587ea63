"""A multi-rank torch job in TrainingLoop (torch.distributed initialized with world_size > 1, e.g. under torchrun; at
any world size when the state holds DTensor parameters): the notice agreed by one MAX all-reduce per step boundary,
rank 0 as the only writer of replicated (DDP) state (every rank writes its shards of sharded state:
respawn.ckpt.torch_sharded), the same restore on every rank, and the collective timeout, with run_beating so that
no collective waits on one rank's disk or download. In full: docs/checkpoint.md ("Multi-rank jobs (torchrun, DDP)").

loop.py calls current_job() only; nothing here runs, and torch is not imported, in a single-process job.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Protocol

from respawn import contract

from . import _log
from .collectives import collective_timeout, release_group, run_beating, wait
from .manager import CheckpointManager, Manager, SaveOutcome, SaveState

_STATES = list(SaveState)
_DURABLE = [None, "local", "remote"]


class Job(Protocol):
    """A job of several processes as TrainingLoop drives it (TorchJob; jax_distributed.JaxJob): every member makes the
    same calls in the same order. writer: whether this member saves (rank 0 of a DDP job; every member of a sharded
    one). save_outcome runs `save` where this member writes and returns the job's outcome, waiting for it until
    `deadline` (time.monotonic(); None: as long as it takes). close (optional): release what the job holds once the
    run has finished (TorchJob: its group)."""

    rank: int
    writer: bool

    def default_manager(self, total_steps: int) -> Manager: ...
    def agree_notice(self, manager: Manager) -> bool: ...
    def restore(self, manager: Manager, like: Any = None) -> tuple[int, Any] | None: ...
    def save_outcome(self, step: int, save: Callable[[], SaveOutcome | None],
                     deadline: float | None) -> SaveOutcome: ...


def stop_agreed(job: "Job | None", manager: Manager) -> bool:
    """At a step boundary: whether this process stops now for a notice, agreed by every member of `job` (a
    collective: every member asks at the same boundary), or, alone, seen by its own manager."""
    return manager.preemption_requested if job is None else job.agree_notice(manager)


def current_job(objects: dict[str, Any] | None = None) -> Job | None:
    """The job this process is a rank of, or None for a single process (neither torch.distributed nor
    jax.distributed initialized with more than one member). A world of one rank is a job too when `objects` hold
    DTensor parameters (FSDP2 under torchrun --nproc-per-node 1): that state is saved and restored through DCP,
    which also reshards a checkpoint written by N ranks onto this one, and back."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and (
            dist.get_world_size() > 1 or _sharded(objects or {})):
        return TorchJob(objects or {})
    if sys.modules.get("jax") is not None:
        from .jax_distributed import current_job as jax_job  # one process per host: respawn.ckpt.jax_distributed

        return jax_job()
    return None


def _sharded(objects: dict[str, Any]) -> bool:
    """Whether a module among the objects holds DTensor parameters (only asked when torch.distributed is up)."""
    from torch.distributed.tensor import DTensor
    from torch.nn import Module

    return any(isinstance(p, DTensor) for obj in objects.values() if isinstance(obj, Module)
               for p in obj.parameters())


class TorchJob:
    """This rank's side of the protocol. Every rank must make the same calls in the same order (collectives).
    objects: the loop's; DTensor parameters among them make the state sharded."""

    def __init__(self, objects: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.nn import Module

        self._torch, self._dist = torch, dist
        self.rank = dist.get_rank()
        # Replicated (DDP) state is saved by rank 0; DTensor parameters (FSDP2's fully_shard, tensor parallel) make
        # the state sharded: every rank saves its shards through DCP (respawn.ckpt.torch_sharded). FSDP1's wrapper
        # is refused: its state_dict() is not DTensors, so rank 0's copy would be a wrong checkpoint.
        modules = {name: obj for name, obj in objects.items() if isinstance(obj, Module)}
        for name, module in modules.items():
            if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
                raise TypeError(
                    f"TrainingLoop: {name}= is wrapped in FSDP1 (FullyShardedDataParallel), which is not supported: "
                    "shard it with FSDP2 (torch.distributed.fsdp.fully_shard), whose DTensor state every rank "
                    "saves, or use DDP.")
        self.sharded = objects if _sharded(modules) else None  # the loop's objects, when sharded
        # The agreement runs at every step: on gloo (CPU tensors) so that an NCCL job does not synchronize its GPU
        # stream per step; on a group of its own, with Respawn's collective timeout whatever the default group's.
        # new_group is itself collective: every rank builds its TrainingLoop.
        self.group = dist.new_group(backend="gloo", timeout=collective_timeout())
        self._age = torch.zeros(1, dtype=torch.int64)

    @property
    def writer(self) -> bool:
        """Whether this rank saves: rank 0 alone for replicated state; every rank, its own shards, for sharded."""
        return self.rank == 0 or self.sharded is not None

    def default_manager(self, total_steps: int) -> Manager:
        if self.sharded is not None:
            from .torch_sharded import TorchShardedManager

            return TorchShardedManager.from_env(total_steps=total_steps)
        return CheckpointManager.from_env(total_steps=total_steps)

    def agree_notice(self, manager: Manager) -> bool:
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

    def close(self) -> None:
        """At the run's end: the agreement's group destroyed and let go (release_group); the job is done with."""
        group, self.group = self.group, None
        release_group(group)

    def restore(self, manager: Manager, held: int | None = None, like: Any = None) -> tuple[int, Any] | None:
        """Every rank restores the step rank 0 restored. Each rank reads the files itself, after rank 0 (which
        may first have downloaded the step into the node's local directory): every rank needs all of the
        replicated state, and N ranks reading it from the node's page cache is cheaper than broadcasting all of
        it through the process group, which would also hold a second copy of it on rank 0. Sharded state: every
        rank loads its shards of the step rank 0 verified (respawn.ckpt.torch_sharded).
        held: the committed step this rank's objects hold already (a process that rejoined a new world): rank 0
        announces it without reading it, and a rank that holds the announced step reads nothing; (step, None)
        then. The collectives are those of a rank that holds nothing: a new process and a rejoined one meet.
        like: the live state replicated state is read into (CheckpointManager.restore)."""
        if self.sharded is not None:
            from .torch_sharded import TorchShardedManager

            if not isinstance(manager, TorchShardedManager):
                raise TypeError("TrainingLoop: sharded (DTensor) parameters need a respawn.ckpt.torch_sharded."
                                "TorchShardedManager on every rank: pass manager=TorchShardedManager.from_env(...), "
                                "or no manager=")
            return manager.restore(like=self.sharded)
        found: list = [(held, None)] if self.rank == 0 and held is not None else []
        # Rank 0's restore may download and read the whole step (keeping a copy on the node's disk for the other
        # ranks): the others wait beating (run_beating).
        manager.keep_restored_copy = self.rank == 0
        run_beating((lambda: found.append(manager.restore(like=like))) if self.rank == 0 and not found else None,
                    self.group)
        restored = found[0] if found else None
        message = self._torch.tensor([restored[0] if restored is not None else -1], dtype=self._torch.int64)
        self._dist.broadcast(message, src=0, group=self.group)  # rank 0's step (-1: none) on every rank
        step = int(message[0])
        if self.rank == 0 or step < 0:
            return restored
        if step == held:
            return step, None
        restored = manager.restore(step=step, like=like)
        if restored is None:
            raise RuntimeError(f"rank {self.rank} cannot restore step {step}, which rank 0 restored; see the "
                               "warnings above (a multi-rank job needs every rank to read the same checkpoint)")
        return restored

    def save_outcome(self, step: int, save: Callable[[], SaveOutcome | None],
                     deadline: float | None) -> SaveOutcome:
        """Rank 0 runs `save` (every rank, when the state is sharded) and sends its outcome; the other ranks
        receive it, waiting until `deadline` (time.monotonic(); None: as long as it takes). A rank that does not
        hear in time reports the step as abandoned for itself; whether it committed is rank 0's marker alone,
        never a torn step."""
        message = self._torch.full((2,), -1, dtype=self._torch.int64)
        outcome = None
        if deadline is None:  # the final save: rank 0 may write and upload for long, the others wait beating
            outcome = run_beating(save if self.writer else None, self.group)
        elif self.writer:
            outcome = save()
        if self.writer:
            outcome = outcome or SaveOutcome(SaveState.FAILED, step, reason="the save thread died")
        if self.rank == 0:
            message[0], message[1] = _STATES.index(outcome.state), _DURABLE.index(outcome.durable)
        try:
            wait(self._dist.broadcast(message, src=0, group=self.group, async_op=True), deadline)
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


def end_job(job: Job | None, manager: Manager | None) -> None:
    """At the end of a run (TrainingLoop's or an integration's: finished, stopped by the notice, or failed, once
    nothing of it is in flight): the process groups it made, destroyed and let go (release_group): the notice
    agreement's (`job`) and the commit's (a GroupSeam's, FilesManager or TorchShardedManager). The manager saves no
    more after it. Safe to call again."""
    close = getattr(job, "close", None)
    if close is not None:
        close()
    seam = getattr(manager, "_seam", None)
    group = getattr(seam, "group", None)
    if group is not None:
        seam.group = manager._group = None
        release_group(group)


def can_rejoin(job: Job | None) -> str | None:
    """Why this process cannot rejoin a new generation in place (TrainingLoop's on_rejoin), or None when it can: a
    torch job of replicated state, one process per node, under a node agent that hands generations over."""
    if not os.environ.get(contract.ENV_REJOIN_FILE):
        return f"${contract.ENV_REJOIN_FILE} is unset (not a multi-node member under the node agent)"
    if not isinstance(job, TorchJob) or job.sharded is not None:
        return "only a torch job of replicated (DDP) state rejoins in place"
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return "started by torchrun, whose rendezvous admits no process of another launcher: it is restarted"
    return None


def rejoin(generation: int, stop: Callable[[], bool], status: Any) -> int | None:
    """Leave this process's world (every process group) and join the next generation's: wait for the agent to hand
    over one newer than `generation` (contract.REJOIN_FILE), take its environment, acknowledge in the status file
    (StatusWriter `status`) and initialise the default process group again as a new process would (env://, the
    same backend, collective_timeout()). The new generation's number; None when stop() turned true while waiting
    (this node's own notice: the process exits instead)."""
    import torch.distributed as dist

    backend = dist.get_backend()
    dist.destroy_process_group()
    path = os.environ[contract.ENV_REJOIN_FILE]
    status.update(rejoin=contract.REJOIN_WAITING)
    _log.info("left the process group; waiting for the next generation", generation=generation)
    while (handed := contract.read_rejoin(path)) is None or handed.generation <= generation:
        if stop():
            return None
        time.sleep(0.05)
    os.environ.update(handed.env)
    status.update(generation=handed.generation, rejoin=contract.REJOIN_JOINING)
    _log.info("joining the next generation in this process", generation=handed.generation,
              rank=os.environ.get("RANK"), world_size=os.environ.get("WORLD_SIZE"),
              master=f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}")
    dist.init_process_group(backend, timeout=collective_timeout())
    return handed.generation
