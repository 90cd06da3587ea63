"""The Hugging Face Transformers `Trainer` under Respawn: the notice on every rank, one agreed stop step, the Trainer's
own checkpoint committed with Respawn's protocol and resumed from. Two lines in the user's script:

    from respawn.ckpt.transformers import resume_path
    trainer.train(resume_from_checkpoint=resume_path(trainer))

resume_path(trainer) adds a RespawnCallback to the trainer (unless `callbacks=[RespawnCallback()]` put one there),
installs the SIGTERM flag handler, and returns the newest committed checkpoint that verifies (a `checkpoint-N`
folder the Trainer reads unchanged) or None. Then, at every optimizer step's end (on_step_end, before the Trainer's
own _maybe_log_save_evaluate): every rank agrees whether any has seen the notice; if so, every rank writes the
Trainer's checkpoint of that step (Trainer._save_checkpoint into Respawn's step directory), the step is committed
(respawn.ckpt.framework_files) and uploaded, and the process exits 75. A `save_steps` (or epoch) save is taken
from the Trainer the same way: the model, optimizer and scheduler state are copied in memory (the parameters and
optimizer state on a thread, while the next step's forward and backward run; its optimizer step waits for the copy
if it is not done), and the Trainer's own code writes its files from that copy on the save's thread, where the
checksums, the commit and the upload run too.

Written as `respawn.ckpt.transformers`: `import transformers` below is the library (absolute imports only).
"""

from __future__ import annotations

import copy
import itertools
import os
import types

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

from . import _log
from .distributed import current_job, end_job, stop_agreed
from .framework_files import Files, FilesManager
from .loop import CheckpointError
from .serialize import SnapshotBuffers

FRAMEWORK = "transformers"


class RespawnCallback(TrainerCallback):
    """Respawn's notice, agreed stop step and commit for a `Trainer`. manager: a FilesManager(framework=
    "transformers") of your own; by default FilesManager.from_env (the RESPAWN_* variables a node sets; by hand,
    ./respawn-checkpoints). Attach it with resume_path(trainer) before trainer.train()."""

    def __init__(self, manager: FilesManager | None = None) -> None:
        self.manager = manager
        self.trainer: Trainer | None = None
        self.job = None
        self._buffers = SnapshotBuffers()  # the periodic save's copies, reused from save to save
        self._complete = False  # the restored step is max_steps: train() trains nothing (on_train_begin)
        self._own_manager = False  # the manager is the default one this callback built
        self._ended = False  # a finished train() released the manager's group (end_job)

    # ---- before train() ---------------------------------------------------------------------------------------

    @staticmethod
    def resume_path(trainer: Trainer) -> str | None:
        """See resume_path()."""
        found = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RespawnCallback)]
        callback = found[0] if found else RespawnCallback()
        if not found:
            trainer.add_callback(callback)
        return callback.attach(trainer)

    def attach(self, trainer: Trainer) -> str | None:
        """Collective (every rank, in the same order): the manager, the agreement's group, the notice handler and
        the restore. Returns the checkpoint folder to resume from, or None."""
        self.trainer, self._complete = trainer, False
        args = trainer.args
        if self.manager is None or (self._ended and self._own_manager):
            self.manager = FilesManager.from_env(
                framework=FRAMEWORK, total_steps=args.max_steps if args.max_steps > 0 else None,
                **({"keep": args.save_total_limit} if args.save_total_limit else {}))
            self._own_manager, self._ended = True, False
        self.job = current_job({})
        jit = [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "JITCheckpointCallback"]
        for cb in jit:  # its SIGTERM handler saves after a fixed wait, on one rank's own step: ours replaces it
            trainer.remove_callback(cb)
        if jit:
            _log.warning("enable_jit_checkpoint is replaced by Respawn's notice: every rank stops at one agreed "
                         "step and the checkpoint is committed; leave enable_jit_checkpoint off")
        self.manager.install_notice_handler()
        _log.info("checkpoints", dir=self.manager.where(), framework=FRAMEWORK)
        restored = self.manager.restore()
        if restored is None:
            return None
        step, step_dir = restored
        where = self.manager.where()
        if 0 < args.max_steps < step:
            raise CheckpointError(f"respawn.ckpt: the checkpoint of step {step} in {where} is past max_steps="
                                  f"{args.max_steps}: pass max_steps >= {step} to go on from it, or give this run "
                                  "another checkpoint folder")
        self._complete = step == args.max_steps
        if self._complete and args.process_index == 0:
            _log.warning(f"the run is already complete at step {step} in {where}: nothing to train; to train again "
                         "from step 0, give this run another checkpoint folder")
        return os.path.join(step_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")

    # ---- the Trainer's events -----------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if self.trainer is None:
            raise SystemExit("respawn.ckpt.transformers: RespawnCallback is not attached to this trainer: call "
                             "trainer.train(resume_from_checkpoint=resume_path(trainer))")
        dataset = getattr(self.trainer, "train_dataset", None)
        if args.ignore_data_skip:
            _log.warning("ignore_data_skip=True: a resumed run starts its epoch's data from the beginning, not where "
                         "the checkpoint stopped; leave it False for an exact resume")
        elif isinstance(dataset, torch.utils.data.IterableDataset):
            _log.warning("the training data is an IterableDataset: a resumed run skips the epoch's consumed batches "
                         "by reading them again, exact only if the dataset yields the same batches every pass; use a "
                         "map-style Dataset for an exact resume")
        if self._complete:
            # The Trainer checks its max_steps only after a step: resumed at max_steps inside an epoch, it would
            # train step max_steps + 1 and save it as the final step (past the total). Its epoch loop calls
            # _run_epoch on the instance: for this train() only, an epoch that trains nothing and stops the loop
            # (the Trainer's own _finalize_training, on_train_end and the lines after train() still run).
            trainer = self.trainer

            def no_epoch(*_args, **_kwargs) -> None:
                trainer.control.should_training_stop = True

            trainer._run_epoch = no_epoch

    def on_step_end(self, args, state, control, **kwargs):
        step, mgr = state.global_step, self.manager
        mgr.report_step(step)
        if stop_agreed(self.job, mgr):
            control.should_save = control.should_evaluate = False  # the Trainer's own save would be a second one
            outcome = mgr.emergency_save(step, Files(now=self._save_checkpoint))
            _log.info(f"preempted at step {step}; emergency checkpoint {outcome.state.value}", step=step,
                      rank=args.process_index)
            end_job(self.job, mgr)  # the process exits next: the groups go first (why: end_job)
            mgr.exit_preempted()
        self._take_save(args, state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._take_save(args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        if self._complete:
            self.trainer.__dict__.pop("_run_epoch", None)
            self._complete = False
        self.manager.finish(state.global_step)  # the last save committed and uploaded before train() returns
        end_job(self.job, self.manager)  # the gloo groups of the agreement and of the commit (why: end_job)
        self.job, self._ended = None, True  # the manager saves no more: another train() builds another

    # ---- saves ------------------------------------------------------------------------------------------------

    def _take_save(self, args, state, control) -> None:
        """A save the Trainer's schedule asks for (steps, epoch), committed by Respawn instead; a save on the best
        metric is decided after evaluation and stays the Trainer's own (into output_dir, not committed)."""
        if not control.should_save or args.save_strategy not in (SaveStrategy.STEPS, SaveStrategy.EPOCH):
            return
        control.should_save = False
        final = state.global_step >= state.max_steps
        self.manager.save(state.global_step, self._periodic_files(), kind="final" if final else "periodic")

    def _save_checkpoint(self, step_dir: str, trainer: Trainer | None = None) -> None:
        """The Trainer's own checkpoint, written by its own code into step_dir/checkpoint-N (every rank: its
        collectives and per-rank files included)."""
        trainer = trainer or self.trainer
        trainer._get_output_dir = lambda trial=None: step_dir  # this call only; the run's output_dir is untouched
        try:
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        finally:
            del trainer._get_output_dir

    def _snapshot_ok(self) -> bool:
        """Whether the Trainer's files can be written from an in-memory copy on the save's thread: state that one
        process holds whole (single process, DDP). FSDP, DeepSpeed, XLA and a model sharded at load time gather
        inside the save (collectives), Hub pushes and best-model tracking read live state: those save on the
        training thread."""
        t = self.trainer
        return not (t.is_fsdp_enabled or t.is_deepspeed_enabled or getattr(t, "is_fsdp_xla_enabled", False)
                    or t.is_distributed_loading_by_transformers or t.args.push_to_hub
                    or t.state.best_global_step or type(t)._save_checkpoint is not Trainer._save_checkpoint)

    def _periodic_files(self) -> Files:
        if not self._snapshot_ok():
            return Files(now=self._save_checkpoint)
        trainer, snap = self.trainer, {}

        def now(step_dir: str) -> None:
            folder = os.path.join(step_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
            trainer.store_flos()  # a collective under DDP: here, as the Trainer's own save does
            trainer._save_rng_state(folder)  # every rank's RNG now, not when the save's thread gets to it
            trainer._save_scaler(folder)
            if trainer.args.should_save:
                snap["trainer"] = self._frozen_trainer()

        def later(step_dir: str) -> None:
            if "trainer" in snap:
                self._buffers.wait()
                self._save_checkpoint(step_dir, snap.pop("trainer"))

        return Files(now=now, later=later)

    def _frozen_trainer(self) -> Trainer:
        """A shallow copy of the trainer whose model weights, optimizer, scheduler, state and stateful callbacks are
        copies of this step's: its _save_checkpoint writes the Trainer's files as of this step, on any thread, once
        the copies are done (`self._buffers.wait()`). The tensors go into buffers kept from save to save (a save
        waits for the previous one first); parameters and optimizer state, which only an optimizer step changes, are
        copied on a thread while the next step's forward and backward run (SnapshotBuffers.copy_until_step)."""
        t, index, later = self.trainer, itertools.count(), []
        params = {p.data_ptr() for p in t.model.parameters()}
        weights, aliases = {}, {}
        for name, v in t.model.state_dict().items():  # tied weights stay one tensor: save_pretrained drops aliases
            key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
            if key not in aliases:
                aliases[key] = self._buffers.copy_tree(v, index, later, params)
            weights[name] = aliases[key]
        optimizer = t.optimizer.state_dict()
        optimizer = {**optimizer, "state": self._buffers.copy_tree(optimizer["state"], index, later),
                     "param_groups": copy.deepcopy(optimizer["param_groups"])}
        self._buffers.copy_until_step(later)
        frozen = copy.copy(t)
        frozen.optimizer = _Saved(optimizer)
        frozen.lr_scheduler = _Saved(copy.deepcopy(t.lr_scheduler.state_dict()))
        frozen.state = copy.deepcopy(t.state)
        frozen.control = copy.deepcopy(t.control)
        frozen.callback_handler = types.SimpleNamespace(callbacks=[
            copy.deepcopy(cb) for cb in t.callback_handler.callbacks if isinstance(cb, ExportableState)])
        frozen.save_model = lambda output_dir=None, _internal_call=False: t._save(output_dir, state_dict=weights)
        frozen.store_flos = frozen._save_rng_state = frozen._save_scaler = lambda *a, **k: None  # done in `now`
        return frozen


class _Saved:
    """An optimizer's or scheduler's state_dict() as it was when copied."""

    def __init__(self, state: dict) -> None:
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def resume_path(trainer: Trainer) -> str | None:
    """Put `trainer` under Respawn (a RespawnCallback, unless it has one) and return the checkpoint to resume from:
    the newest committed step that verifies, local disk first, then the job's checkpoint_uri; None when there is
    none. Call it on every rank, after the Trainer is built:
    trainer.train(resume_from_checkpoint=resume_path(trainer))."""
    return RespawnCallback.resume_path(trainer)
