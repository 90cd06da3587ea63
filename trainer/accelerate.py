"""Hugging Face Accelerate custom loops under Respawn: `accelerator.save_state` / `load_state` committed with
Respawn's protocol, stopped at one agreed step on the notice.

    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
    run = RespawnAccelerate(accelerator, total_steps=1000, every=100)   # restores the newest committed step
    for step, batch in run.steps(data):                                 # instead of `for epoch ...: for batch ...`
        ...                                                             # the step body, as before

Constructing it restores the newest committed step that verifies with `accelerator.load_state(step_dir)` (model,
optimizer, scheduler, scaler, RNG, registered objects) and installs the SIGTERM flag handler. At every step
boundary all ranks agree on the notice (one all-reduce); on it every rank writes `accelerator.save_state(step_dir)`
into one step of a FilesManager (framework "accelerate"), votes, and exits 75 (Preempted) once member 0 committed.
Every `every` steps the same state is committed off the training thread (the training thread only copies it); after
the last step a blocking final save. The data position (epoch, batches of the epoch done, the seedable sampler's
seed) is respawn_data_position.json in the step directory; resuming sets the epoch and skips the batches done with
`accelerator.skip_first_batches`. `import accelerate` here is the library (absolute import: this module is
respawn.ckpt.accelerate).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from typing import Any, Callable, Iterator

from respawn import contract

from . import _log, distributed
from .framework_files import Files, FilesManager
from .loop import ENV_FRESH, CheckpointError, Preempted
from .manager import SaveOutcome
from .serialize import SnapshotBuffers

POSITION = "respawn_data_position.json"
FRAMEWORK = "accelerate"
FRESH = f"to start fresh, run with {ENV_FRESH}=1 (deletes the checkpoints there)"


class RespawnAccelerate:
    """Runs steps start..total_steps-1 of an Accelerate loop and checkpoints them (see the module's docstring).

    accelerator: after prepare(). total_steps: steps of the whole run (one batch of `steps(data)` each). every:
    periodic save interval in steps (0: none). manager: default FilesManager.from_env(framework="accelerate").
    signals: handled as the notice until the steps end. Attributes: start (the restored step, or 0), step (steps
    completed), manager, final (the final save's SaveOutcome)."""

    def __init__(self, accelerator: Any, total_steps: int, *, every: int, manager: FilesManager | None = None,
                 signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        if total_steps < 0 or every < 0:
            raise ValueError(f"total_steps and every must be >= 0, got {total_steps} and {every}")
        if accelerator.project_configuration.automatic_checkpoint_naming:
            raise ValueError("RespawnAccelerate: ProjectConfiguration(automatic_checkpoint_naming=True) makes "
                             "save_state ignore the step directory Respawn gives it: leave it False")
        self.accelerator, self.total_steps, self.every = accelerator, total_steps, every
        self.manager = manager or FilesManager.from_env(framework=FRAMEWORK, total_steps=total_steps)
        self._job = distributed.current_job({})  # the notice's agreement (None: a single process)
        self._first = self._job is None or self._job.rank == 0
        self.start = self.step = 0
        self.final: SaveOutcome | None = None
        self._position = {"epoch": 0, "batches": 0}
        self._buffers = SnapshotBuffers()  # the periodic saves' copies: page-faulted once, then a memcpy
        self._handlers = self.manager.install_notice_handler(tuple(signals)) or {} if signals else {}
        if self._first:
            _log.info(f"checkpoints: {self.manager.where()}")
        try:
            self._restore()
        except BaseException:
            self._restore_handlers()
            raise

    # ---- restore ------------------------------------------------------------------------------------------------

    def _restore(self) -> None:
        if os.environ.get(ENV_FRESH) == "1" and self._first:  # before member 0's restore looks
            if os.environ.get(contract.ENV_JOB_ID):
                _log.warning(f"{ENV_FRESH}=1 ignored under the node agent: a job's restarts resume")
            else:
                removed = self.manager.discard_checkpoints()
                _log.warning(f"{ENV_FRESH}=1: starting from step 0; deleted {len(removed)} checkpoint step(s) in "
                             f"{self.manager.where()}", removed=removed)
        restored = self.manager.restore()
        if restored is not None:
            step, step_dir = restored
            if step > self.total_steps:
                raise CheckpointError(f"respawn.ckpt: the checkpoint of step {step} in {self.manager.where()} is past "
                                      f"total_steps={self.total_steps}: pass total_steps >= {step}, or {FRESH}")
            try:
                self.accelerator.load_state(step_dir)
            except Exception as exc:  # noqa: BLE001 - one line, not a traceback
                why = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
                raise CheckpointError(f"respawn.ckpt: accelerator.load_state could not load step {step} from "
                                      f"{step_dir} ({type(exc).__name__}: {why[:300]}); it was written for another "
                                      f"model or setup: {FRESH}, or give this run another checkpoint folder") from exc
            path = os.path.join(step_dir, POSITION)
            if os.path.exists(path):
                with open(path) as f:
                    self._position = json.load(f)
            self.start = self.step = step
            if step == self.total_steps and self._first:
                _log.warning(f"the run is already complete at step {step} in {self.manager.where()}: nothing to "
                             f"train; to train again from step 0, run with {ENV_FRESH}=1 (deletes its checkpoints)")
        self.manager.report_step(self.step)
        _log.info("accelerate loop", start=self.start, total_steps=self.total_steps, every=self.every,
                  data_position=self._position)

    def _restore_handlers(self) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._handlers = {}

    # ---- the steps ----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        """The steps without data (a loop that draws its own batches: their position is not restored)."""
        for step, _ in self._run(None):
            yield step

    def steps(self, data: Any) -> Iterator[tuple[int, Any]]:
        """(step, batch) from `data` (a prepared DataLoader), epoch after epoch, resumed at the batch after the
        last one the restored step trained on."""
        _check_resumable(data, self._first)
        return self._run(data)

    def _run(self, data: Any) -> Iterator[tuple[int, Any]]:
        mgr, total, every = self.manager, self.total_steps, self.every
        batches = self._batches(data) if data is not None else None
        try:
            step = self.step
            stop = distributed.stop_agreed(self._job, self.manager)
            while True:
                if stop:
                    self._emergency(step)
                if step >= total:
                    break
                yield step, (next(batches) if batches is not None else None)
                step += 1
                self.step = step
                mgr.report_step(step)
                if mgr.store_error is not None:
                    raise CheckpointError(f"respawn.ckpt: the first checkpoint of this run could not be written to "
                                          f"{mgr.store_error}; check the store's credentials, permissions and space")
                stop = distributed.stop_agreed(self._job, self.manager)
                if not stop and every and step % every == 0 and step < total:
                    mgr.save(step, self._periodic_files())  # blocks for the copy of the state only
            self.final = mgr.save(total, self._files(), blocking=True)
            mgr.finish(total)
            if self.final is None or not self.final.committed:
                why = f"{self.final.state.value}: {self.final.reason}" if self.final else "the save thread died"
                raise RuntimeError(f"the final checkpoint (step {total}) was not committed: {why}")
        except Preempted:
            raise
        except BaseException:  # a crash in the step body, or a loop left early: an in-flight save commits first
            self.manager.close()
            raise
        finally:
            self._restore_handlers()
            # The process exits next (0, 75 after a notice, or a crash): the gloo groups of the agreement and of
            # the commit go first, nothing of them in flight (why: distributed.end_job, collectives.release_group).
            distributed.end_job(self._job, mgr)
            self._job = None

    def _emergency(self, step: int) -> None:
        outcome = self.manager.emergency_save(step, self._files())
        self.manager.status.flush()
        raise Preempted(outcome)

    def _batches(self, data: Any) -> Iterator[Any]:
        import torch

        epoch, done = self._position["epoch"], self._position["batches"]
        sampler = _sampler(data)
        if "seed" in self._position and sampler is not None and hasattr(sampler, "initial_seed"):
            sampler.initial_seed = self._position["seed"]  # the shuffle of the run that wrote the step
        while True:
            data.set_epoch(epoch)
            source = self.accelerator.skip_first_batches(data, done) if done else data
            # A DataLoader's iterator draws its base seed from torch's global RNG as it starts. An uninterrupted run
            # drew it at the epoch's start, before the restored RNG state was saved: a resume inside the epoch
            # takes that draw back.
            rng = torch.get_rng_state() if done else None
            for batch in source:
                if rng is not None:
                    torch.set_rng_state(rng)
                    rng = None
                done += 1
                self._position = {"epoch": epoch, "batches": done}
                if sampler is not None and hasattr(sampler, "initial_seed"):
                    self._position["seed"] = int(sampler.initial_seed)
                yield batch
            if rng is not None:  # resumed at the epoch's end: the skip's iterator drew a seed the next one must not see
                torch.set_rng_state(rng)
            epoch, done = epoch + 1, 0

    # ---- what a save writes -------------------------------------------------------------------------------------

    def _write_position(self, step_dir: str) -> None:
        if self.accelerator.is_main_process:
            with open(os.path.join(step_dir, POSITION), "w") as f:
                json.dump(self._position, f)

    def _files(self) -> Files:
        """The emergency and final saves: Accelerate's own save_state, on the caller's thread."""

        def now(step_dir: str) -> None:
            self.accelerator.save_state(step_dir)
            self._write_position(step_dir)

        return Files(now=now)

    def _periodic_files(self) -> Files:
        """A periodic save: the models', optimizers' and schedulers' state copied on the training thread, written by
        the save's thread in save_state's layout; the small files (RNG, scaler, samplers, registered objects) now.
        Sharded or engine-saved models (FSDP, DeepSpeed, Megatron-LM, XLA) save through save_state here."""
        from accelerate.utils import DistributedType

        acc = self.accelerator
        if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM,
                                    DistributedType.XLA):
            return self._files()
        later: list[Callable[[str], None]] = []

        def now(step_dir: str) -> None:
            later.append(_snapshot(acc, step_dir, self._buffers))
            self._write_position(step_dir)

        return Files(now=now, later=lambda step_dir: later[0](step_dir))


def _snapshot(acc: Any, step_dir: str, buffers: SnapshotBuffers) -> Callable[[str], None]:
    """save_state split in two: the small files written now and a copy of the large state (into `buffers`, reused
    from save to save: the manager's save waits for the previous one first), which the returned function writes
    where and as save_state does (file names from accelerate.utils)."""
    from accelerate.checkpointing import save_accelerator_state, save_custom_state
    from accelerate.utils import OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, SCHEDULER_NAME, save

    each_node = acc.project_configuration.save_on_each_node  # safetensors weights: save_state's default, as ours
    index = itertools.count()

    # Parameters and optimizer state change only in an optimizer step: copied on a thread meanwhile. Buffers (a
    # norm's running statistics) change in the forward pass: copied now.
    later: list = []
    params = {p.data_ptr() for model in acc._models for p in model.parameters()}
    weights = [buffers.copy_tree(acc.get_state_dict(model, unwrap=False), index, later, params)
               for model in acc._models]
    optimizers = [buffers.copy_tree(opt.state_dict(), index, later) for opt in acc._optimizers]
    buffers.copy_until_step(later)
    if acc._save_model_state_pre_hook:
        buffers.wait()  # a hook reads the weights
    for hook in acc._save_model_state_pre_hook.values():
        hook(acc._models, weights, step_dir)
    schedulers = [buffers.copy_tree(s.state_dict(), index) for s in acc._schedulers]
    # RNG, step, scaler and samplers: the state of this very boundary, small.
    save_accelerator_state(step_dir, [], [], [], acc._dataloaders, acc.state.process_index, acc.step, acc.scaler,
                           save_on_each_node=each_node)
    for i, obj in enumerate(acc._custom_objects):
        save_custom_state(obj, step_dir, i, save_on_each_node=each_node)

    def write(step_dir: str) -> None:
        buffers.wait()  # the copies on the thread, and those from the GPU into pinned buffers
        for i, state in enumerate(weights):
            name = SAFE_WEIGHTS_NAME.replace(".", f"_{i}.") if i else SAFE_WEIGHTS_NAME
            save(state, os.path.join(step_dir, name), save_on_each_node=each_node, safe_serialization=True)
        for prefix, states in ((OPTIMIZER_NAME, optimizers), (SCHEDULER_NAME, schedulers)):
            for i, state in enumerate(states):
                name = f"{prefix}.bin" if i == 0 else f"{prefix}_{i}.bin"
                save(state, os.path.join(step_dir, name), save_on_each_node=each_node)

    return write


def _sampler(data: Any) -> Any:
    from accelerate.data_loader import get_sampler

    try:
        return get_sampler(data)
    except AttributeError:
        return None


def _check_resumable(data: Any, first: bool) -> None:
    """Name once, at start, a data pipeline whose position the resume cannot restore exactly."""
    from accelerate.data_loader import SeedableRandomSampler
    from torch.utils.data import IterableDataset, RandomSampler

    if not hasattr(data, "set_epoch"):
        raise TypeError(f"RespawnAccelerate.steps takes the DataLoader accelerator.prepare returned, not "
                        f"{type(data).__name__}")
    if getattr(data, "use_stateful_dataloader", False):
        raise ValueError("RespawnAccelerate.steps: the DataLoader is a StatefulDataLoader (use_stateful_dataloader="
                         "True), which load_state already moved to its saved position: Respawn resumes the data "
                         "itself; leave use_stateful_dataloader off")
    if not first:
        return
    sampler = _sampler(data)
    if isinstance(getattr(data, "dataset", None), IterableDataset):
        _log.warning("the DataLoader reads an IterableDataset: a resume skips the batches done by reading them "
                     "again, exact only if the dataset yields the same order for the same set_epoch(); a map-style "
                     "Dataset resumes exactly")
    elif isinstance(sampler, RandomSampler) and not isinstance(sampler, SeedableRandomSampler):
        _log.warning("the DataLoader shuffles with a plain RandomSampler, whose order a resume cannot repeat: "
                     "pass Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)) "
                     "for an exact resume")
