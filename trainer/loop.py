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
step (respawn.ckpt.distributed).
"""

from __future__ import annotations

import signal
import time
from typing import Any, Iterator

from respawn import contract

from . import _log, distributed
from .manager import CheckpointManager, Manager, SaveOutcome
from .objects import accessors, capture_rng, like, restore_rng


class Preempted(SystemExit):
    """Raised at the step boundary after the emergency save that a preemption notice asked for. A SystemExit
    whose code is contract.EXIT_PREEMPTED (75): uncaught, the process exits with it. `outcome` is the emergency
    save's; catch it to log or clean up, then re-raise (or exit with `code` yourself)."""

    def __init__(self, outcome: SaveOutcome) -> None:
        super().__init__(contract.EXIT_PREEMPTED)
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

    Attributes: start (first step of this life), step (steps completed), state, manager, final (the final
    save's SaveOutcome).
    """

    def __init__(self, total_steps: int, *, every: int, state: Any = None, manager: Manager | None = None,
                 rng: bool = True, signals: tuple[int, ...] = (signal.SIGTERM,), **objects: Any) -> None:
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
        self._objects = {name: accessors(name, obj) for name, obj in objects.items()}
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
        if self.signals:
            self._previous_handlers = self.manager.install_notice_handler(self.signals) or {}
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

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous_handlers = {}

    def _restore(self) -> None:
        restored = self.manager.restore() if self._job is None else self._job.restore(self.manager)
        if restored is not None:
            step, ckpt = restored
            wanted = list(self._objects) + (["state"] if self._has_state else [])
            missing = [k for k in wanted if not isinstance(ckpt, dict) or k not in ckpt]
            if missing:
                held = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
                raise ValueError(f"checkpoint of step {step} has no {missing} (it holds {held}); the keyword "
                                 "names given to TrainingLoop are the checkpoint's keys")
            if step > self.total_steps:
                raise ValueError(f"checkpoint of step {step} is past total_steps={self.total_steps}")
            for name, (_, load) in self._objects.items():
                load(ckpt[name])
            if self._has_state:
                self.state = like(ckpt["state"], self.state)
            if self.rng and "rng" in ckpt:
                restore_rng(ckpt["rng"])
            self.start = self.step = step
        if self._writes and self.every and (self.start // self.every + 1) * self.every < self.total_steps:
            self.manager.prepare_snapshot(self._capture())  # buffers for the periodic saves, off the loop
        _log.info("training loop", start=self.start, total_steps=self.total_steps, every=self.every,
                  notice_signals=[signal.Signals(s).name for s in self._previous_handlers])

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
        if mgr.preemption_requested if self._job is None else self._job.agree_notice(mgr):  # during the restore
            self._preempt(step)
        first, began = True, time.monotonic()
        while step < total:
            yield step
            step += 1
            self.step = step
            mgr.report_step(step)  # rate-limited status file update
            if first:  # when this life's training really began (the boot benchmark reads it, bench/boot.py)
                _log.info("first step done", step=step, seconds=round(time.monotonic() - began, 3))
                first = False
            # Inlined: the single-process path pays no extra call per step.
            if mgr.preemption_requested if self._job is None else self._job.agree_notice(mgr):
                self._preempt(step)
            if every and step % every == 0 and step < total and self._writes:
                mgr.save(step, self._capture())  # blocks for the snapshot only
        self.final = self._save(total, lambda: mgr.save(total, self._capture(), blocking=True), "periodic")
        mgr.finish(total)
        if self.final is None or not self.final.committed:
            why = f"{self.final.state.value}: {self.final.reason}" if self.final else "the save thread died"
            raise RuntimeError(f"the final checkpoint (step {total}) was not committed: {why}")

    def _preempt(self, step: int) -> None:
        # Every rank waits for rank 0's outcome within the notice deadline, then all exit with the same code.
        raise Preempted(self._save(step, lambda: self.manager.emergency_save(step, self._capture()), "emergency",
                                   deadline=self.manager.deadline()))

    def _save(self, step: int, save, kind: str, deadline: float | None = None) -> SaveOutcome | None:
        """save() here; in a job, the job's outcome, which a member that does not write records as well."""
        if self._job is None:
            return save()
        outcome = self._job.save_outcome(step, save, deadline)
        if not self._writes:
            self.manager.note_outcome(outcome, kind)
        return outcome
