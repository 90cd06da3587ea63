"""PyTorch Lightning under Respawn: one callback, `Respawn`, and a sampler, `StatefulSampler`.

    from respawn.ckpt.lightning import Respawn, StatefulSampler
    loader = StatefulDataLoader(dataset, batch_size=32, sampler=StatefulSampler(dataset, seed=0))  # torchdata's
    trainer = L.Trainer(..., callbacks=[Respawn(every=50)])   # trainer.fit(model, loader): unchanged

- Resume: in its `setup` hook (the process group is up), every rank finds the newest committed step that verifies
  (respawn.ckpt.framework_files) and hands its .ckpt to Lightning's own checkpoint connector, as
  `trainer.fit(ckpt_path=...)` would: weights, optimizers, schedulers, loops, callbacks and the dataloader's state.
- The notice: Respawn's SIGTERM handler only sets a flag; at every optimizer step's batch end the ranks agree on it
  (one MAX all-reduce on a gloo group of its own) and all stop after the same step: the emergency checkpoint
  (`trainer.save_checkpoint`'s file, committed when every rank voted) and exit 75. Lightning's own SIGTERM handling
  is switched off for the fit: its handler broadcasts inside the signal handler, from the ranks the signal reached
  only (the DDP deadlock of Lightning #20806), and saving in a handler (#21406) is not ours either.
- Periodic saves every `every` steps: the checkpoint is dumped and its tensors copied into reused buffers on the
  training thread (the snapshot), written, checksummed, committed and uploaded on the save's thread. A Checkpoint
  callback: Lightning adds no default ModelCheckpoint beside it.
- The data position: Lightning saves and restores a train loader that has state_dict()/load_state_dict() in its fit
  loop's state; torchdata's StatefulDataLoader with StatefulSampler resumes the shuffled order exactly, under DDP
  and with loader workers too (the sampler's state carries its epoch). A loader without state, or a sampler
  Lightning wrapped for DDP, is named once at train start.
- Each rank's global RNGs are saved beside Lightning's file (which lacks them) and restored at train start.

Importing this module imports lightning, torch and torchdata; `respawn.ckpt` itself does not.
"""

from __future__ import annotations

import itertools
import os
import signal
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from respawn import contract

from . import _log, distributed
from .framework_files import Files, FilesManager
from .loop import ENV_FRESH, CheckpointError, Preempted
from .manager import SaveOutcome
from .objects import capture_rng, restore_rng
from .serialize import SnapshotBuffers

FRAMEWORK = "lightning"
FILENAME = "checkpoint.ckpt"  # the step directory's Lightning checkpoint: trainer.fit(ckpt_path=<step dir>/this)
RNG_FILE = "respawn-rng-{rank}.pt"  # each rank's global RNGs (Python, NumPy, torch), which Lightning's file lacks


class StatefulSampler(StatefulDistributedSampler):
    """The train loader's sampler for an exact resume: `StatefulDataLoader(dataset, batch_size=...,
    sampler=StatefulSampler(dataset, seed=0))`. torchdata's StatefulDistributedSampler (this rank's share of a
    permutation drawn from seed + epoch; its position saved and restored by the StatefulDataLoader that holds it),
    with the rank and world size taken from torchrun's RANK and WORLD_SIZE (one process: 0 and 1), so it is built
    before Lightning starts the process group; a DistributedSampler, it is what Lightning's DDP leaves in place
    (it would wrap any other sampler in a DistributedSamplerWrapper, whose order does not resume); Lightning sets its
    epoch before the first batch is drawn. A position saved at an epoch's last batch resumes at the next epoch's
    first, where torchdata's would resume an empty epoch.

    Its state holds its epoch too. With loader workers the resumed loader's iterator draws indices at once, as it is
    created: Lightning creates it (in its fit loop's setup_data, with the loader's restored state) before it sets
    the sampler's epoch, and mid-epoch does not create it again, so without the epoch in the state the rest of a
    resumed epoch after the first would be read in epoch 0's order. (The position itself is torchdata's: a
    multi-process StatefulDataLoader's state is a snapshot taken at the last batch it handed out, not at what its
    workers fetched ahead.)"""

    _EPOCH = "epoch"

    def __init__(self, dataset: Any, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas=int(os.environ.get("WORLD_SIZE", "1")),
                         rank=int(os.environ.get("RANK", "0")), shuffle=shuffle, seed=seed, drop_last=drop_last)

    def __iter__(self):
        if self.next_yielded is not None and self.next_yielded >= self.num_samples:
            self.next_yielded = None
        return super().__iter__()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), self._EPOCH: self.epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        epoch = state_dict.get(self._EPOCH)  # absent: a state written before the epoch was in it
        if epoch is not None:
            # Saved at an epoch's last batch: the resume reads the next epoch from its start (see __iter__).
            self.set_epoch(epoch + 1 if self.next_yielded >= self.num_samples else epoch)


class Respawn(Checkpoint):
    """Respawn's notice, agreement, commit and resume for a Lightning `Trainer.fit` (every rank runs it).

    every: a periodic checkpoint every `every` optimizer steps (0: none; the notice's and the final one still are).
    manager: default FilesManager.from_env(framework="lightning", total_steps=trainer.max_steps): the RESPAWN_*
    variables under the node agent, `./respawn-checkpoints` by hand. signals: handled as the notice during fit.

    Attributes: manager, start (the step this fit resumed at, or 0), final (the final save's SaveOutcome),
    resumed_from (the restored .ckpt's path, or None)."""

    def __init__(self, every: int = 0, *, manager: FilesManager | None = None,
                 signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        if every < 0:
            raise ValueError(f"Respawn(every=...) must be >= 0, got {every}")
        self.every, self.manager, self.signals = every, manager, tuple(signals)
        self.start = 0
        self.final: SaveOutcome | None = None
        self.resumed_from: str | None = None
        self._job: Any = None
        self._own_manager = False  # the manager is the default one this callback built
        self._ended = False  # a finished fit released the manager's group (end_job)
        self._handlers: dict = {}
        self._last_step = 0  # the global step the batch-end hook last acted on (each fit's setup resets both)
        self._saved_step = -1  # the last step saved
        self._rng_file: str | None = None  # this rank's RNG file in the restored step
        self._buffers = SnapshotBuffers()  # the periodic snapshots' copies: page-faulted once, then a memcpy

    # ---- the fit's start: the notice handler, then the restore ------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.start, self.resumed_from, self._rng_file = 0, None, None
        self._last_step, self._saved_step = 0, -1  # step 0 is no boundary: nothing trained yet
        # Lightning's SignalConnector would, in its SIGTERM handler, broadcast on the default group from whichever
        # ranks the signal reached (a collective in a signal handler: Lightning #20806). Ours sets a flag only; the
        # ranks agree at a step boundary. So Lightning registers none for this trainer's fits.
        trainer._signal_connector.register_signal_handlers = lambda: None
        if self.manager is None or (self._ended and self._own_manager):
            self.manager = self._default_manager(trainer)  # collective under torchrun: the commit's gloo group
            self._own_manager, self._ended = True, False
        if self.signals:
            self._handlers = self.manager.install_notice_handler(self.signals) or {}
        self._job = distributed.current_job({})  # a TorchJob under torchrun (world size > 1): the agreement's group
        where = self.manager.where()
        if trainer.global_rank == 0:
            _log.info(f"checkpoints: {where}")
        if os.environ.get(ENV_FRESH) == "1":  # rank 0 deletes before any rank's restore looks
            if os.environ.get(contract.ENV_JOB_ID):
                if trainer.global_rank == 0:
                    _log.warning(f"{ENV_FRESH}=1 ignored under the node agent: a job's restarts resume")
            elif trainer.global_rank == 0:
                removed = self.manager.discard_checkpoints()
                _log.warning(f"{ENV_FRESH}=1: starting from step 0; deleted {len(removed)} checkpoint step(s) in "
                             f"{where}", removed=removed)
            trainer.strategy.barrier("respawn-fresh")
        restored = self.manager.restore()  # every rank: the step rank 0 verified, as a local directory
        if restored is None:
            _log.info("no committed checkpoint: training from the start", rank=trainer.global_rank)
            return
        step, step_dir = restored
        fresh = f"to start fresh, run with {ENV_FRESH}=1 (deletes the checkpoints there)"
        if trainer.max_steps and 0 < trainer.max_steps < step:
            raise CheckpointError(f"respawn.ckpt: the checkpoint of step {step} in {where} is past max_steps="
                                  f"{trainer.max_steps}: pass max_steps >= {step} to go on from it, or {fresh}")
        path = os.path.join(step_dir, FILENAME)
        # What trainer.fit(ckpt_path=path) does first; Lightning then restores the module, callbacks, optimizers,
        # schedulers and loops (the dataloader's state included) from it in its own order.
        connector = trainer._checkpoint_connector
        connector.resume_start(path)
        saved = connector._loaded_checkpoint.get("state_dict", {})
        mine = pl_module.state_dict()
        unfit = sorted(k for k in set(saved) | set(mine) if k not in saved or k not in mine
                       or tuple(saved[k].shape) != tuple(mine[k].shape))
        if unfit:
            raise CheckpointError(f"respawn.ckpt: the checkpoint of step {step} in {where} does not fit the model "
                                  f"({len(unfit)} parameter(s) missing or of another shape, e.g. {unfit[0]}); it was "
                                  f"written for another model: {fresh}, or give this run another checkpoint folder")
        self.start = self._last_step = self._saved_step = step
        self.resumed_from = path
        self.manager.report_step(step)
        if step == trainer.max_steps and trainer.global_rank == 0:
            _log.warning(f"the run is already complete at step {step} in {where}: nothing to train; to train again "
                         f"from step 0, run with {ENV_FRESH}=1 (deletes its checkpoints)")
        self._rng_file = os.path.join(step_dir, RNG_FILE.format(rank=trainer.global_rank))
        _log.info("resuming", step=step, checkpoint=path, rank=trainer.global_rank)

    def _default_manager(self, trainer: pl.Trainer) -> FilesManager:
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        return FilesManager.from_env(framework=FRAMEWORK, total_steps=total)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The global RNGs (dropout, augmentations) as they were at the saved step, once Lightning has restored and
        # set up everything else; a step written by another world size has no file for some ranks: said once.
        if self._rng_file is not None:
            if os.path.exists(self._rng_file):
                restore_rng(torch.load(self._rng_file, weights_only=False))
            else:
                _log.warning("no RNG state for this rank in the restored step (written by a smaller world): the "
                             "global RNGs go on from this run's seed", rank=trainer.global_rank, step=self.start)
            self._rng_file = None
        if trainer.global_rank != 0:
            return
        combined = trainer.fit_loop._combined_loader
        for loader in combined.flattened if combined is not None else []:
            batches = getattr(loader, "batch_sampler", None)
            sampler = getattr(batches, "sampler", None) or getattr(loader, "sampler", None)
            if not isinstance(loader, _Stateful):
                why = f"the train dataloader ({type(loader).__name__}) has no state_dict()"
            elif isinstance(sampler, DistributedSamplerWrapper):
                why = ("Lightning's DDP wrapped the train dataloader's sampler (a DistributedSamplerWrapper, whose "
                       "order is drawn anew after a resume)")
            else:
                continue
            _log.warning(f"{why}: a resume mid-epoch does not continue the epoch's order where it stopped; use "
                         "StatefulDataLoader(dataset, batch_size=..., sampler=respawn.ckpt.lightning.StatefulSampler("
                         "dataset, seed=...)) (torchdata.stateful_dataloader)")

    # ---- every optimizer step: the notice, the periodic save --------------------------------------------------

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_step:  # a batch of gradient accumulation: no optimizer step, not a boundary
            return
        self._last_step = step
        mgr = self.manager
        mgr.report_step(step)
        if mgr.store_error is not None:  # this run's first save could not write its store
            raise CheckpointError(f"respawn.ckpt: the first checkpoint of this run could not be written to "
                                  f"{mgr.store_error}; check the store's credentials, permissions and space (or give "
                                  "another checkpoint folder): without it a restart would lose every step")
        stop = distributed.stop_agreed(self._job, mgr)
        if stop:
            outcome = mgr.emergency_save(step, self._in_place(trainer))
            self._saved_step = step
            _log.info("stopped for the notice at the agreed step", step=step, rank=trainer.global_rank,
                      emergency=outcome.state.value)
            raise Preempted(outcome)
        if self.every and step % self.every == 0 and step != trainer.max_steps:
            # One process or DDP: rank 0's dict is the whole checkpoint, snapshotted here and written on the save's
            # thread. Another strategy (FSDP, DeepSpeed) writes from every rank, collectives included: here.
            replicated = isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy))
            mgr.save(step, self._snapshot(trainer) if replicated else self._in_place(trainer))
            self._saved_step = step

    def _in_place(self, trainer: pl.Trainer) -> Files:
        """The step written on this thread: trainer.save_checkpoint (rank 0 writes the file) and every rank's RNGs."""
        rank = trainer.global_rank

        def now(step_dir: str) -> None:
            trainer.save_checkpoint(os.path.join(step_dir, FILENAME), weights_only=False)
            torch.save(capture_rng(), os.path.join(step_dir, RNG_FILE.format(rank=rank)))

        return Files(now=now)

    def _snapshot(self, trainer: pl.Trainer) -> Files:
        """Lightning's checkpoint as trainer.save_checkpoint writes it, copied on this thread into buffers reused from
        save to save (training goes on changing the tensors in place; the manager's save waits for the previous
        write before `now`), and written by rank 0 on the save's thread; every rank's RNGs beside it."""
        rank, writes, io = trainer.global_rank, trainer.is_global_zero, trainer.strategy.checkpoint_io
        held: dict = {}

        def now(step_dir: str) -> None:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)  # every rank: its hooks
            held["rng"] = capture_rng()
            if writes:
                held["checkpoint"] = self._buffers.copy_tree(checkpoint, itertools.count())

        def later(step_dir: str) -> None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # the copies from the GPU into pinned buffers were asynchronous
            torch.save(held["rng"], os.path.join(step_dir, RNG_FILE.format(rank=rank)))
            if writes:
                io.save_checkpoint(held["checkpoint"], os.path.join(step_dir, FILENAME))

        return Files(now=now, later=later)

    # ---- the end of the fit -------------------------------------------------------------------------------------

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final checkpoint, blocking, so that a finished run's last step is committed before exit 0."""
        step, mgr = trainer.global_step, self.manager
        if step == self._saved_step:
            self.final = mgr.wait()
            if step != self.start and (self.final is None or not self.final.committed):
                raise RuntimeError(f"respawn.ckpt.lightning: the final checkpoint (step {step}) was not committed: "
                                   f"{self.final.reason if self.final else 'the save thread died'}")
        else:
            self.final = mgr.save(step, self._in_place(trainer), blocking=True)
            if self.final is None or not self.final.committed:
                why = f"{self.final.state.value}: {self.final.reason}" if self.final else "the save thread died"
                raise RuntimeError(f"respawn.ckpt.lightning: the final checkpoint (step {step}) was not committed: "
                                   f"{why}")
        mgr.finish(step)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()  # Lightning calls no teardown hook after an exception
        if self.manager is None:
            return
        if isinstance(exception, Preempted):
            self.manager.status.flush()  # the emergency save dealt with the in-flight save
        else:
            self.manager.close()  # e.g. a crash in training_step: let an in-flight periodic save commit
        self._end_job()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_handlers()
        if stage == "fit":  # also a fit that trained nothing (already complete), which has no on_train_end
            self._end_job()

    def _restore_handlers(self) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._handlers = {}

    def _end_job(self) -> None:
        """The gloo groups of the agreement and of the commit destroyed and let go (why: distributed.end_job); the
        manager saves no more: another fit builds another (or, a manager of yours, cannot save)."""
        if self._job is not None or self.manager is not None:
            distributed.end_job(self._job, self.manager)
            self._job, self._ended = None, True
