"""What a heartbeat says about progress and the network: how long the trainer's step has not changed and its first
step (every node: a recovery's end), and whether the generation's master answers (a multi-node member), for the
control plane's stall rule (functions/job.py).

A partitioned member still beats (it reaches Firestore) while its collective hangs; the controller sees the step
stop everywhere, and tells which member is cut off by who can no longer reach the master.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Hashable

from respawn.contract import MASTER_PROBE_PORT


class StepClock:
    """Seconds since the running trainer's step last changed; None until its first step: a trainer's start
    (imports, rendezvous, restore) is not timed here, only the pauses of a trainer that has stepped."""

    def __init__(self) -> None:
        self._key: Hashable = None
        self._start_step: int | None = None
        self._step: int | None = None
        self._since = time.monotonic()
        # The running trainer's first step and when it was seen (wall clock): where its training began (the
        # report's step line, goodput, a recovery's end: respawn.control.recovery_time); None before it stepped.
        # As fine as the beats that read the status file.
        self.first_step: int | None = None
        self.first_step_at: datetime | None = None

    def idle(self, running: bool, trainer: Hashable, step: int | None, committed: int | None = None,
             own: tuple[int, datetime] | None = None) -> float | None:
        """`trainer` names the trainer's life (a new one restarts the clock); None while no trainer runs.
        `committed`: the status file's committed step. A step at or below it is no step trained: the status's
        first write (step 0) and a restore (step = committed step) are not the first step. `own`: the first step
        this life's trainer recorded itself, with its time (the status file's first_step/first_step_at): exact,
        so it wins over a beat's sighting, and it still counts when the trainer has ended by the beat that reads it
        (a resumed run short enough to fit between two beats stepped all the same)."""
        now = time.monotonic()
        if running and trainer != self._key:  # the status file's step from before this trainer is no step of it
            self._key, self._start_step, self._step, self._since = trainer, step, step, now
            self.first_step = self.first_step_at = None
        if own is not None:
            self.first_step, self.first_step_at = own
        if not running:
            self._key = None
            return None
        if step != self._step:
            self._step, self._since = step, now
            if self.first_step is None and step is not None and step > (committed if committed is not None else 0):
                self.first_step, self.first_step_at = step, datetime.now(timezone.utc)
        return None if self._step == self._start_step else now - self._since


class Progress:
    """The heartbeat's progress fields for any trainer: `step_idle_seconds` and its first step with its time.
    `on_first_step` is called once a trainer's first step is seen: a recovery ends there
    (respawn.control.recovery_time)."""

    def __init__(self, on_first_step: Callable[[], object]) -> None:
        self._clock = StepClock()
        self._on_first_step = on_first_step

    def beat(self, running: bool, trainer: Hashable, status: dict | None, started_at: datetime) -> dict:
        """This beat's fields; `trainer` names the trainer's life (StepClock.idle), `started_at` its start."""
        step, committed = (status or {}).get("step"), (status or {}).get("committed_step")
        before = self._clock.first_step
        idle = self._clock.idle(running, trainer, step if isinstance(step, int) else None,
                                committed if isinstance(committed, int) else None, own_first_step(status, started_at))
        if running and before is None and self._clock.first_step is not None:
            self._on_first_step()  # not for a trainer seen stepped only once it ended: its end wakes the controller
        return {"step_idle_seconds": idle, "first_step": self._clock.first_step,
                "first_step_at": self._clock.first_step_at}


def own_first_step(status: dict | None, started_at: datetime) -> tuple[int, datetime] | None:
    """The first step the trainer started at `started_at` recorded in its status file (TrainerStatus.first_step,
    first_step_at), or None: not recorded (yet, or by a trainer that does not), or left there by an earlier life."""
    step, at = (status or {}).get("first_step"), (status or {}).get("first_step_at")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(at, (int, float)):
        return None
    when = datetime.fromtimestamp(at, timezone.utc)
    return (step, when) if when >= started_at else None


def answers(address: str, port: int = MASTER_PROBE_PORT, timeout: float = 3.0) -> bool:
    """A TCP connect to address:port is answered: accepted, or refused (the host is there, nothing listens)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:  # timed out, no route to host, network unreachable: nothing came back
        return False


class MasterProbe(threading.Thread):
    """Probes the aimed address every `interval` s; `reachable` is the last answer (None: not aimed / not yet)."""

    def __init__(self, interval: float) -> None:
        super().__init__(name="master-probe", daemon=True)
        self.interval = interval
        self._target: str | None = None
        self._result: tuple[str, bool] | None = None
        self._wake = threading.Event()

    def aim(self, address: str | None) -> None:
        if address != self._target:
            self._target = address
            self._wake.set()

    @property
    def reachable(self) -> bool | None:
        result, target = self._result, self._target
        return result[1] if result is not None and target is not None and result[0] == target else None

    def run(self) -> None:
        while True:
            target = self._target
            if target is not None:
                self._result = (target, answers(target, timeout=min(3.0, max(0.5, self.interval))))
            self._wake.wait(self.interval)
            self._wake.clear()
