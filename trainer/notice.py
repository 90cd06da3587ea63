"""The preemption notice inside a training process: the SIGTERM handler that only notes it, the in-process way to
deliver it, its deadline (the notice + the budget), and this process's registration as one that saves
(contract.Saver), so that the node agent's notice reaches it and not its loader workers.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from respawn import contract

from . import _log

if TYPE_CHECKING:
    from .commit import SaveOutcome


class Notice:
    """A manager's notice: `at` (time.monotonic()) and why, or None; `budget_s` from it to the deadline."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.at: float | None = None
        self.reason: str | None = None
        self._logged = False
        self._dir = os.environ.get(contract.ENV_NOTICE_DIR) or None

    def install(self, signals: tuple[int, ...]) -> dict | None:
        """SIGTERM only sets a flag; the loop acts on it at the next step boundary. Main thread only. Returns the
        previous handlers {signal: handler} (a None handler: one not installed from Python), or None when not in
        the main thread (nothing installed: deliver the notice with request()). Under the node agent or
        respawn.ckpt.launch this process registers as one that saves (contract.Saver): the notice comes to it, not
        to its loader workers; one delivered before it registered is taken now."""
        if threading.current_thread() is not threading.main_thread():
            _log.warning("not in the main thread: SIGTERM handler not installed; call request_preemption()")
            return None
        previous = {sig: signal.signal(sig, self.on_signal) for sig in signals}
        self.register(None)
        if self._dir and contract.notice_marked(self._dir):
            self.request("notice delivered before this process listened")
        return previous

    def register(self, outcome: SaveOutcome | None) -> None:
        """Register this process in the run's notice directory (when it has one), with its emergency save's outcome
        once it ended."""
        if not self._dir:
            return
        rank = os.environ.get("RANK", "")
        record = contract.Saver(os.getpid(), contract.process_start_time(os.getpid()),
                                int(rank) if rank.isdigit() else None,
                                None if outcome is None else {"state": outcome.state.value, "step": outcome.step,
                                                              "reason": outcome.reason})
        try:
            record.write(self._dir)
        except OSError as exc:
            _log.warning("cannot register for the notice; it reaches this process on its process group instead",
                         dir=self._dir, error=str(exc))

    def on_signal(self, signum, frame) -> None:
        # Python runs it in the main thread: record, and nothing that may block or fail (no logging, no I/O).
        if self.at is None:
            self.at = time.monotonic()
            self.reason = f"signal {signal.Signals(signum).name}"
        ignore_children()

    def request(self, reason: str, at: float | None = None) -> None:
        if self.at is None:
            self.at = time.monotonic() if at is None else at
            self.reason = reason

    def clear(self) -> None:
        self.at, self.reason, self._logged = None, None, False

    def requested(self, step: int) -> bool:
        """Whether a notice came; the first answer that says so is logged, with the step it stops at."""
        if self.at is not None and not self._logged:
            self._logged = True
            _log.warning("preemption notice received; emergency checkpoint at this step boundary",
                         reason=self.reason, step=step, budget_s=self.budget_s)
        return self.at is not None

    def deadline(self) -> float:
        start = self.at if self.at is not None else time.monotonic()
        return start + self.budget_s


def ignore_children() -> None:
    """From the notice on, a child's death raises nothing in this process: torch's DataLoader installs a SIGCHLD
    handler that raises RuntimeError in the main thread wherever it is when a loader worker dies (an OOM kill, a
    user's bug), which would cost the emergency save of the state already in memory. A worker that is needed still
    fails its fetch. Main thread only (signal.signal)."""
    if callable(signal.getsignal(signal.SIGCHLD)):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
