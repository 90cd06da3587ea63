"""JAX with Orbax under Respawn: Orbax writes each step in its own format, Respawn's notice, agreement and commit
decide when, and a plain Orbax restore reads it.

    with OrbaxCheckpoints(total_steps=STEPS, every=100) as ckpt:      # RESPAWN_* variables; ./respawn-checkpoints
        start, state = ckpt.restore(state)                            # by hand
        for step in range(start, STEPS):
            state = train_step(state, step)
            ckpt.save(step + 1, state)       # every step: a periodic save every `every`, the final one at STEPS,
                                             # the emergency one at the agreed step of a notice (then exit 75)

Each step directory (respawn.ckpt.framework_files) holds one Orbax checkpoint, `state/`, written by
`ocp.StandardCheckpointer` (its own temporary directory and rename, its own barriers between processes), beside
Respawn's manifest.json and COMMITTED. Orbax's save starts on the training thread (its blocking part: the arrays'
host copies, its barriers and directory); its background write and finalize are waited for on Respawn's save thread
(`later`), so the step is checksummed and voted on only once Orbax has renamed `state/` into place, and no Orbax
thread outlives the save. The promise: `ocp.StandardCheckpointer().restore(<step dir>/state, target)` reads a
committed step, as restore() here does. In full: docs/frameworks.md ("JAX with Orbax").
"""

from __future__ import annotations

import os
import signal
from typing import Any

import jax
import orbax.checkpoint as ocp

from respawn.logs import one_line

from . import _log
from .distributed import current_job, stop_agreed
from .framework_files import Files, FilesManager
from .loop import CheckpointError, Preempted
from .manager import SaveOutcome

FRAMEWORK = "orbax"
ITEM = "state"  # the Orbax checkpoint in each step directory: <checkpoint dir>/step_<12 digits>/state
_FRESH = "to start fresh, move that folder's step_* directories away (or give this run another checkpoint folder)"


class OrbaxCheckpoints:
    """One per process (every process of a jax.distributed job makes the same calls in the same order).
    total_steps: the run's last step (its save is the final, blocking one). every: a periodic save every so many
    steps (0: none). manager: a FilesManager(framework="orbax") of your own; by default from the RESPAWN_* variables
    (the node agent's), else ./respawn-checkpoints. signals: the notice's signals, handled while the `with` lasts."""

    def __init__(self, total_steps: int, every: int = 0, *, manager: FilesManager | None = None,
                 signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        if manager is None:
            # One status file per node: the committing process's (the others learn every outcome from it).
            kwargs = {} if jax.process_index() == 0 else {"status_file": None}
            manager = FilesManager.from_env(framework=FRAMEWORK, total_steps=total_steps, **kwargs)
        self.manager, self.total_steps, self.every, self.signals = manager, total_steps, every, signals
        self._job = current_job({})
        self._handlers: dict = {}
        self._saves = 0  # this life's saves: Orbax's barrier keys of each are its own
        self._hosts_checked = False

    def __enter__(self) -> "OrbaxCheckpoints":
        if jax.process_index() == 0:
            _log.info(f"checkpoints: {self.manager.where()}")
        self._handlers = self.manager.install_notice_handler(self.signals) or {}
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._handlers = {}
        if isinstance(exc, Preempted):
            self.manager.status.flush()
        else:
            self.manager.close()  # an in-flight periodic save commits before the process ends

    # ---- restore ------------------------------------------------------------------------------------------------

    def restore(self, state: Any) -> tuple[int, Any]:
        """(step, state) of the newest committed step that verifies, read by plain Orbax into arrays shaped,
        typed and sharded as `state`'s (every process reads the shards its devices hold); (0, state) when there is
        none. A checkpoint that does not fit `state` is one line naming the folder and how to start fresh."""
        self._check_hosts()
        found = self.manager.restore()
        if found is None:
            return 0, state
        step, step_dir = found
        where = f"the checkpoint of step {step} in {self.manager.where()}"
        if step > self.total_steps:
            raise CheckpointError(f"respawn.ckpt: {where} is past total_steps={self.total_steps} (the run that wrote "
                                  f"it went further): pass total_steps >= {step} to go on from it, or {_FRESH}")
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        try:
            with ocp.StandardCheckpointer() as orbax:
                restored = orbax.restore(os.path.join(os.path.abspath(step_dir), ITEM), target)
        except Exception as exc:  # noqa: BLE001 - Orbax's refusal of the saved state: one line, not a traceback
            raise CheckpointError(f"respawn.ckpt: {where} does not fit the state "
                                  f"({one_line(f'{type(exc).__name__}: {exc}')}); it was written for another model "
                                  f"or setup: {_FRESH}") from exc
        return step, restored

    # ---- the steps ----------------------------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> SaveOutcome | None:
        """Call after every step with the step just finished (collective: every process at the same step). Agrees
        on the notice; at the agreed step writes the emergency checkpoint and raises Preempted (exit 75). Otherwise
        a periodic save when `every` divides `step` (asynchronous: returns None), and at total_steps the final
        blocking one (its outcome; RuntimeError if it was not committed)."""
        mgr = self.manager
        mgr.report_step(step)
        stop = stop_agreed(self._job, mgr)
        if stop:
            raise Preempted(self._outcome(step, lambda: mgr.emergency_save(step, self._files(step, state))))
        if step >= self.total_steps:
            final = self._outcome(step, lambda: mgr.save(step, self._files(step, state), blocking=True))
            mgr.finish(step)
            if not final.committed:
                raise RuntimeError(f"the final checkpoint (step {step}) was not committed: {final.state.value}: "
                                   f"{final.reason}")
            return final
        if self.every and step % self.every == 0:
            mgr.save(step, self._files(step, state))
        return None

    def _outcome(self, step: int, save) -> SaveOutcome:
        if self._job is None:
            return save()
        return self._job.save_outcome(step, save, None)  # the agreement's watcher ends first

    def _check_hosts(self) -> None:
        """Orbax's processes write one directory (process 0 merges and renames it): hosts with checkpoint
        directories of their own cannot share an Orbax step. Collective (the first time)."""
        if self._hosts_checked:
            return
        self.manager._find_hosts()
        self._hosts_checked = True
        if self.manager._per_host:
            raise CheckpointError(f"respawn.ckpt.orbax_ckpt: the {jax.process_count()} processes have checkpoint "
                                  f"directories of their own ({self.manager.where()} on this one); Orbax writes one "
                                  "directory every process shares: give every process the same local checkpoint "
                                  "directory on a shared filesystem (RESPAWN_LOCAL_CHECKPOINT_DIR)")

    def _files(self, step: int, state: Any) -> Files:
        """Orbax's save of `state` into the step directory: started in `now` (the caller's thread), finished in
        `later` (the save's thread, or the caller's for an emergency save). A checkpointer per save, made in `now`
        (a step committed already writes nothing) and closed in `later`: its barrier keys are this save's own (a
        step saved again after an abandoned try included), and none of its threads outlives the save."""
        self._check_hosts()
        self._saves += 1
        prefix = f"respawn_{step}_{self._saves}"
        held: list = []  # the checkpointer, or the exception its save raised

        def now(step_dir: str) -> None:
            try:
                orbax = ocp.StandardCheckpointer(
                    multiprocessing_options=ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=prefix))
                held.append(orbax)
                orbax.save(os.path.join(os.path.abspath(step_dir), ITEM), state)  # Orbax: absolute paths only
            except Exception as exc:  # noqa: BLE001 - raised in `later`: this process then votes no
                held.append(exc)

        def later(step_dir: str) -> None:
            orbax, failed = held[0], held[-1]
            try:
                if isinstance(failed, Exception):
                    raise failed
                orbax.wait_until_finished()  # Orbax's write, its barriers, its finalize: `state/` renamed in place
            finally:
                if not isinstance(orbax, Exception):
                    orbax.close()

        return Files(now=now, later=later)
