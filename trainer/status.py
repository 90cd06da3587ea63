"""Writes the progress file the node agent reads (path in contract.ENV_STATUS_FILE; schema and reader:
respawn.contract.TrainerStatus and read_status), replaced atomically (temp file in the same directory + fsync +
rename), at most a few times per second for step updates and immediately on a commit or an emergency-save change.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time

from respawn.contract import idle_emergency, new_status


class StatusWriter:
    """Keeps the status object in memory and writes it out; thread-safe (the async saver updates it too)."""

    def __init__(self, path: str | None, total_steps: int | None = None, min_interval_s: float = 0.25) -> None:
        self.path = path
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._dirty = False
        self.state = new_status(total_steps, os.getpid(), time.time())

    def snapshot(self) -> dict:
        with self._lock:
            return copy.deepcopy(self.state)

    def update(self, *, force: bool = True, emergency: dict | None = None, **fields) -> None:
        with self._lock:
            self.state.update(fields)
            if emergency is not None:
                self.state["emergency"] = {**idle_emergency(), **emergency}
            self._dirty = True
            now = time.monotonic()
            if not force and now - self._last_write < self.min_interval_s:
                return
            self._write_locked(now)

    def flush(self) -> None:
        with self._lock:
            if self._dirty:
                self._write_locked(time.monotonic())

    def _write_locked(self, now: float) -> None:
        self._last_write = now
        self._dirty = False
        if not self.path:
            return
        self.state["updated_at"] = time.time()
        self.state["pid"] = os.getpid()
        directory = os.path.dirname(os.path.abspath(self.path))
        tmp = os.path.join(directory, f".{os.path.basename(self.path)}.{os.getpid()}.tmp")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(self.state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            from . import _log

            _log.warning("cannot write the status file; the agent will see stale progress",
                         path=self.path, error=str(exc))
