"""What the agent's signal handlers may touch. Python runs a handler in the main thread between two bytecodes, also
while that thread holds a lock the handler then asks for: with a lock that is not re-entrant, the agent blocks for
good (no emergency save, no final heartbeat)."""

from __future__ import annotations

import threading


class SignalSafeEvent:
    """threading.Event's set, clear and wait on a re-entrant lock: the agent's main loop waits on it, and the signal
    handlers set it. threading.Event's lock is not re-entrant, and its wait() and clear() hold it: a SIGTERM
    handled there would block the agent."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._flag = False

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._flag or self._cond.wait(timeout)
