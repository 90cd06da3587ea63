"""TrainingLoop: the whole checkpoint protocol around a plain `for` loop.

    with TrainingLoop(total_steps, every=50, model=model, optimizer=opt, scheduler=sched, data=data) as loop:
        for step in loop:                 # 0-based: the step to run now
            train_one_step(step)

Entering restores the newest committed checkpoint in place (or starts at 0) with the SIGTERM handler installed;
after each step body the loop reports progress, takes the periodic asynchronous save every `every` steps, and on
a preemption notice saves the emergency checkpoint at that step boundary and raises Preempted (a SystemExit with
contract.EXIT_PREEMPTED); after the last step it takes the blocking final save. Leaving the `with` block puts the
previous SIGTERM handler back. CheckpointManager's explicit calls are what it runs, and stay available.

In a multi-rank job (torch.distributed initialized, world_size > 1, e.g. under torchrun; at any world size when a
model holds DTensor parameters) every rank runs the same loop: the ranks agree on the notice at each step boundary,
rank 0 alone writes the checkpoints (every rank its shards, for DTensor state), and every rank restores the same
step (respawn.ckpt.distributed). With on_rejoin, a multi-node member's process survives a new generation: the stop
at a step boundary is agreed as a notice's, and the process joins the new world and goes on in the same `for` loop
(docs/checkpoint.md, "Survivors keep their processes").
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable, Iterator

from respawn import contract
from respawn.logs import one_line

from . import _log, distributed
from .manager import CheckpointManager, Manager, SaveOutcome
from .objects import accessors, capture_rng, like, restore_rng

# The one switch for a fresh start: RESPAWN_FRESH=1 deletes the checkpoints in the run's folder (local and remote)
# before the restore, so the run trains from step 0. For runs by hand: under the node agent it is ignored (a job's
# restarts must resume; give the job another checkpoint_uri instead).
ENV_FRESH = "RESPAWN_FRESH"


class CheckpointError(SystemExit):
    """This run cannot go on with the checkpoints it found or the store it was given (a checkpoint that does not fit
    the objects, one past total_steps, a store its first save could not write): a SystemExit whose code is a
    one-line message naming the folder and what to do; uncaught, Python prints it and the process exits 1."""


class Preempted(SystemExit):
    """Raised at the step boundary after the emergency save that a preemption notice asked for. A SystemExit
    whose code is contract.EXIT_PREEMPTED (75) when that save committed, else contract.EXIT_NOTICE_UNSAVED (76):
    uncaught, the process exits with it. `outcome` is the emergency save's; catch it to log or clean up, then
    re-raise (or exit with `code` yourself)."""

    def __init__(self, outcome: SaveOutcome | None) -> None:
        super().__init__(contract.exit_on_notice(outcome is not None and outcome.committed))
        self.outcome = outcome


class TrainingLoop:
    """Runs steps start..total_steps-1 (start: the restored step, or 0) and checkpoints them.

    total_steps: steps of the whole run. every: periodic save interval in steps (0: no periodic saves).
    state: an immutable pytree (JAX): read and replace `loop.state` in the step body; restored from the checkpoint
    into the initial value's structure and shardings (respawn.ckpt.jax_state.to_template).
    **objects: restored in place and saved under their keyword name (the checkpoint's keys: keep them stable):
    anything with state_dict()/load_state_dict() (torch model, optimizer, scheduler, DCP-style Stateful),
    get_state()/set_state() (torch.Generator, numpy RandomState), a numpy.random.Generator, or a dict (the data
    position; restored with clear() + update()).
    manager: default CheckpointManager.from_env(total_steps=total_steps). rng: also save and restore the global
    RNGs (Python, NumPy, and torch's when torch is imported). signals: handled as the notice inside the loop.
    on_rejoin: declares that this process can leave its torch.distributed world for a multi-node job's next
    generation and join that one without restarting (the node agent hands it over: contract.REJOIN_FILE); called
    in the new world, after the default process group is initialised again with the new rank and world size and
    before the restore: rebuild there what holds the old process group (a DDP wrapper) or depends on the rank.
    Every process of the new world makes the same collectives: a new one makes them in the code before the loop.

    Attributes: start (first step of this life), step (steps completed), state, manager, final (the final
    save's SaveOutcome).
    """

    def __init__(self, total_steps: int, *, every: int, state: Any = None, manager: Manager | None = None,
                 rng: bool = True, signals: tuple[int, ...] = (signal.SIGTERM,),
                 on_rejoin: Callable[[], Any] | None = None, **objects: Any) -> None:
        if total_steps < 0 or every < 0:
            raise ValueError(f"total_steps and every must be >= 0, got {total_steps} and {every}")
        if state is None and not objects:
            raise ValueError("nothing to checkpoint: pass state= and/or the objects to restore in place")
        self.total_steps, self.every, self.rng, self.signals = total_steps, every, rng, tuple(signals)
        self.state = state
        self._has_state = state is not None
        # None: a single process, on which nothing below costs anything (FSDP2 at world size 1 is a job: DCP state).
        self._job = distributed.current_job(objects)
        self._writes = self._job is None or self._job.writer
        self._raw_objects = objects
        self._objects = {name: accessors(name, obj) for name, obj in objects.items()}
        self._on_rejoin, self._generation, self._own_notice = None, 0, False
        if on_rejoin is not None:
            why_not = distributed.can_rejoin(self._job)
            if why_not is None:
                self._on_rejoin, self._generation = on_rejoin, int(os.environ.get(contract.ENV_GENERATION) or 0)
            else:
                _log.info("this trainer is restarted for a new generation, not rejoined in its process",
                          reason=why_not)
        if manager is None:
            manager = (CheckpointManager.from_env(total_steps=total_steps) if self._job is None
                       else self._job.default_manager(total_steps))
        self.manager = manager
        if self.manager.status.snapshot()["total_steps"] != total_steps:
            self.manager.status.update(total_steps=total_steps)
        self.start = self.step = 0
        self.final: SaveOutcome | None = None
        self._entered = self._iterated = False
        self._previous_handlers: dict = {}

    # ---- scope: the signal handler and the restore ----------------------------------------------------------

    def __enter__(self) -> "TrainingLoop":
        if self._entered:
            raise RuntimeError("a TrainingLoop is entered once")
        self._entered = True
        if self._first_rank:
            _log.info(f"checkpoints: {self.manager.where()}")
        if self.signals:
            self._previous_handlers = self.manager.install_notice_handler(self.signals) or {}
        if self._on_rejoin is not None and self._previous_handlers:
            self._handle_rejoin_signals()
        else:
            self._on_rejoin = None  # no signal handlers (not the main thread, or signals=()): restarted instead
        try:
            self._restore()
        except BaseException:
            self._restore_handlers()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._restore_handlers()
        if isinstance(exc, Preempted):
            self.manager.status.flush()  # the emergency save dealt with the in-flight save; no waiting past it
        else:
            self.manager.close()  # e.g. a crash in the step body: let an in-flight periodic save commit
        # The process exits next, also after a notice or a crash: the groups this run made go first (a finished
        # run's went at its end): why in respawn.ckpt.collectives.release_group.
        distributed.end_job(self._job, self.manager)

    def _handle_rejoin_signals(self) -> None:
        """The agent's hand-over signal stops the world at a step boundary, as a notice does; the notice's own
        signals are noted too, so that after the emergency save this process exits on its own notice only."""
        for sig in self.signals:
            inner = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame, inner=inner: (setattr(self, "_own_notice", True),
                                                                   inner(signum, frame)))
        handover = getattr(signal, contract.REJOIN_SIGNAL)
        self._previous_handlers[handover] = signal.signal(handover, self._on_handover)
        self.manager.status.update(generation=self._generation, rejoin=contract.REJOIN_READY)

    def _on_handover(self, signum, frame) -> None:
        # A signal for a generation this process has joined already (sent as it read the file) is not a new stop.
        handed = contract.read_rejoin(os.environ[contract.ENV_REJOIN_FILE])
        if handed is not None and handed.generation > self._generation:
            self.manager.request_preemption(f"generation {handed.generation} handed over")

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous_handlers = {}

    @property
    def _first_rank(self) -> bool:
        return self._job is None or self._job.rank == 0

    def _start_fresh(self) -> None:
        """RESPAWN_FRESH=1: the first rank deletes every checkpoint of the folder before anyone restores."""
        if os.environ.get(ENV_FRESH) != "1":
            return
        if os.environ.get(contract.ENV_JOB_ID):
            _log.warning(f"{ENV_FRESH}=1 ignored under the node agent: a job's restarts resume; give the job "
                         "another checkpoint_uri to start over")
            return
        if self._first_rank:
            removed = self.manager.discard_checkpoints()
            _log.warning(f"{ENV_FRESH}=1: starting from step 0; deleted {len(removed)} checkpoint step(s) in "
                         f"{self.manager.where()} (unset {ENV_FRESH} for the next run, or it deletes this run's too)",
                         removed=removed)

    def _restore(self) -> None:
        self._start_fresh()
        # The objects' own tensors receive the restored bytes (no second copy of the state in memory).
        live = self._capture()
        restored = self.manager.restore(like=live) if self._job is None else self._job.restore(self.manager, like=live)
        self._load(restored)
        if restored is not None:
            self.start = self.step = restored[0]
            if self.start == self.total_steps and self._first_rank:
                _log.warning(f"the run is already complete at step {self.start} in {self.manager.where()}: nothing to "
                             f"train; to train again from step 0, run with {ENV_FRESH}=1 (deletes its checkpoints)")
        if self._writes and self.every and (self.start // self.every + 1) * self.every < self.total_steps:
            self.manager.prepare_snapshot(self._capture())  # buffers for the periodic saves, off the loop
        _log.info("training loop", start=self.start, total_steps=self.total_steps, every=self.every,
                  notice_signals=[signal.Signals(s).name for s in self._previous_handlers])

    def _load(self, restored: tuple[int, Any] | None) -> None:
        """Load a restored step into the objects (a step held already comes as (step, None): nothing to load)."""
        if restored is not None and restored[1] is not None:
            step, ckpt = restored
            fresh = f"to start fresh, run with {ENV_FRESH}=1 (deletes the checkpoints there)"
            if step > self.total_steps:
                raise CheckpointError(
                    f"respawn.ckpt: the checkpoint of step {step} in {self.manager.where()} is past total_steps="
                    f"{self.total_steps} (the run that wrote it went further): pass total_steps >= {step} to go on "
                    f"from it, or {fresh}")
            wanted = list(self._objects) + (["state"] if self._has_state else [])
            missing = [k for k in wanted if not isinstance(ckpt, dict) or k not in ckpt]
            if missing:
                held = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
                raise CheckpointError(
                    f"respawn.ckpt: the checkpoint of step {step} in {self.manager.where()} has no {missing} (it holds "
                    f"{held}; the keyword names given to TrainingLoop are the checkpoint's keys): {fresh}")
            loads = [(name, load) for name, (_, load) in self._objects.items()]
            if self._has_state:
                loads.append(("state", lambda saved: setattr(self, "state", like(saved, self.state))))
            for name, load in loads:
                try:
                    load(ckpt[name])
                except Exception as exc:  # noqa: BLE001 - any refusal of the saved state: one line, not a traceback
                    raise CheckpointError(
                        f"respawn.ckpt: the checkpoint of step {step} in {self.manager.where()} does not fit {name}= "
                        f"({one_line(f'{type(exc).__name__}: {exc}')}); it was written for another model or setup: "
                        f"{fresh}, or give this run another checkpoint folder") from exc
            if self.rng and "rng" in ckpt:
                restore_rng(ckpt["rng"])

    def _capture(self) -> dict:
        ckpt = {name: get() for name, (get, _) in self._objects.items()}
        if self._has_state:
            ckpt["state"] = self.state
        if self.rng:
            ckpt["rng"] = capture_rng()
        return ckpt

    # ---- the steps ------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        if self._iterated:
            raise RuntimeError("a TrainingLoop runs once")
        self._iterated = True
        if self._entered:
            yield from self._steps()
        else:  # `for step in TrainingLoop(...)` without `with`: the loop is its own scope
            with self:
                yield from self._steps()

    def _steps(self) -> Iterator[int]:
        mgr, total, every = self.manager, self.total_steps, self.every
        step = self.start
        stop = distributed.stop_agreed(self._job, mgr)  # during the restore
        first, began = True, time.monotonic()
        while True:
            if stop:
                step = self._stop(step)  # Preempted, or this process joined a new world at `step`
                # The new world agrees once before its first step, as a new process does after its restore.
                stop = distributed.stop_agreed(self._job, mgr)
                continue
            if step >= total:
                break
            yield step
            step += 1
            self.step = step
            mgr.report_step(step)  # rate-limited status file update
            if mgr.store_error is not None:  # this run's first save could not write its store
                raise self._unwritable(mgr.store_error)
            if first:  # when this life's training really began (the boot benchmark reads it, bench/boot.py)
                _log.info("first step done", step=step, seconds=round(time.monotonic() - began, 3))
                first = False
            # Inlined: the single-process path pays no extra call per step.
            stop = distributed.stop_agreed(self._job, mgr)
            if not stop and every and step % every == 0 and step < total and self._writes:
                mgr.save(step, self._capture())  # blocks for the snapshot only
        self.final = self._save(total, lambda: mgr.save(total, self._capture(), blocking=True), "periodic")
        mgr.finish(total)
        close = getattr(self._job, "close", None)  # its group: none of the loop's threads outlives the run
        if close is not None:
            close()
        if mgr.store_error is not None:
            raise self._unwritable(mgr.store_error)
        if self.final is None or not self.final.committed:
            why = f"{self.final.state.value}: {self.final.reason}" if self.final else "the save thread died"
            raise RuntimeError(f"the final checkpoint (step {total}) was not committed: {why}")

    def _unwritable(self, error: str) -> CheckpointError:
        return CheckpointError(f"respawn.ckpt: the first checkpoint of this run could not be written to "
                               f"{one_line(error)}; "
                               "check the store's credentials, permissions and space (or give another checkpoint "
                               "folder): without it a restart would lose every step")

    def _stop(self, step: int) -> int:
        """The agreed stop at step boundary `step`: the emergency save (every rank waits for rank 0's outcome within
        the notice deadline), then Preempted (exit 75), or, for a process that can rejoin and got no notice of its
        own, the next generation's world: the step it resumes at there."""
        outcome = self._save(step, lambda: self.manager.emergency_save(step, self._capture()), "emergency",
                             deadline=self.manager.deadline())
        if self._on_rejoin is None or self._own_notice:
            raise Preempted(outcome)
        assert outcome is not None
        self._job = None  # its groups go with the world
        generation = distributed.rejoin(self._generation, lambda: self._own_notice, self.manager.status)
        if generation is None:
            raise Preempted(outcome)
        self._generation = generation
        self._on_rejoin()
        self._job = distributed.current_job(self._raw_objects)
        self._writes = self._job is None or self._job.writer
        # The newcomers read the step from storage: this process's own copy is good for them once it is there.
        held = step if outcome.committed and outcome.durable == "remote" else None
        live = self._capture()
        restored = ((held, None) if held is not None else self.manager.restore(like=live)) if self._job is None \
            else self._job.restore(self.manager, held=held, like=live)
        if restored is None:
            raise RuntimeError(f"generation {generation} has no checkpoint to resume from, and this process's state "
                               f"is at step {step}: it cannot start over in place; the agent starts it again")
        self._load(restored)
        self.step = restored[0]
        if not self._own_notice:
            self.manager.clear_preemption()
        self.manager.status.update(step=self.step, rejoin=contract.REJOIN_READY)
        _log.info("rejoined: training on in this process", generation=generation, step=self.step,
                  reloaded=restored[1] is not None, pid=os.getpid())
        return self.step

    def _save(self, step: int, save, kind: str, deadline: float | None = None) -> SaveOutcome | None:
        """save() here; in a job, the job's outcome, which a member that does not write records as well."""
        if self._job is None:
            return save()
        outcome = self._job.save_outcome(step, save, deadline)
        if not self._writes:
            self.manager.note_outcome(outcome, kind)
        return outcome


