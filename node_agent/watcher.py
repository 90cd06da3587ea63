"""Watch the metadata server for the preemption notice and the host-maintenance notice.

One thread per key. Each reads the key once (a node that is already flagged must not wait for a change that
never comes), then hangs on `?wait_for_change=true&last_etag=E`. The ETag makes reconnects safe: if the value
changed while the connection was down (503 during maintenance, a dropped connection, a timeout), the next
hanging GET returns at once with the new value, so no notice is missed.

`KeyWatch` is the pure part (what to ask next, what an answer means) and is tested without a server.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from respawn.logs import log

from .metadata import TRANSPORT_ERRORS, MetadataClient, MetadataError

PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"

# Notice names as they appear in the heartbeat's `notice` field.
NOTICE_PREEMPTED = "preempted"
NOTICE_MAINTENANCE = "maintenance-event"
NOTICE_SIGTERM = "sigterm"

# MIGRATE_ON_HOST_MAINTENANCE is a live migration: the VM keeps running, so it is no notice. Older samples
# spell the terminate value SHUTDOWN_ON_HOST_MAINTENANCE.
_TERMINATING_MAINTENANCE = {"TERMINATE_ON_HOST_MAINTENANCE", "SHUTDOWN_ON_HOST_MAINTENANCE"}


def is_preempted(value: str) -> bool:
    return value.strip().upper() == "TRUE"


def is_terminating_maintenance(value: str) -> bool:
    return value.strip().upper() in _TERMINATING_MAINTENANCE


@dataclass
class KeyWatch:
    """The state of watching one key: its last value and ETag."""

    path: str
    notice: str
    is_notice: Callable[[str], bool]
    etag: str | None = None
    value: str | None = None

    def wants_plain_read(self) -> bool:
        """Without an ETag (start, or a server that sent none) the key is read, not waited on."""
        return self.etag is None

    def on_answer(self, value: str, etag: str | None) -> tuple[bool, bool]:
        """Record an answer; returns (is a notice, value or ETag changed)."""
        changed = etag != self.etag or value.strip() != self.value
        self.value, self.etag = value.strip(), etag
        return self.is_notice(value), changed


def preempted_watch() -> KeyWatch:
    return KeyWatch(PREEMPTED, NOTICE_PREEMPTED, is_preempted)


def maintenance_watch() -> KeyWatch:
    return KeyWatch(MAINTENANCE, NOTICE_MAINTENANCE, is_terminating_maintenance)


class Backoff:
    def __init__(self, first: float = 0.1, cap: float = 2.0):
        self.first, self.cap, self.next = first, cap, first
        self.failures = 0

    def fail(self) -> float:
        delay = self.next
        self.next = min(self.next * 2, self.cap)
        self.failures += 1
        return delay

    def ok(self) -> None:
        self.next, self.failures = self.first, 0


class Watcher(threading.Thread):
    """Runs one KeyWatch against the server and calls on_notice(notice, value) once, when it fires."""

    def __init__(self, md: MetadataClient, watch: KeyWatch, on_notice: Callable[[str, str], None], *,
                 wait_seconds: float = 60.0, retry_cap: float = 2.0, min_cycle: float = 0.5):
        super().__init__(name=f"watch-{watch.path}", daemon=True)
        self.md, self.watch, self.on_notice = md, watch, on_notice
        self.wait_seconds, self.min_cycle = wait_seconds, min_cycle
        self.backoff = Backoff(cap=retry_cap)
        self.stopped = threading.Event()
        self._last_reason: str | None = None
        self.first_answer = threading.Event()  # set once the key has been read (the agent starts nothing before)

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        while not self.stopped.is_set():
            if self.step():
                return

    def step(self) -> bool:
        """One request. Returns True once the notice has fired (the watcher is then done)."""
        w = self.watch
        started = time.monotonic()
        try:
            if w.wants_plain_read():
                value, etag = self.md.read(w.path)
            else:
                value, etag = self.md.wait_for_change(w.path, w.etag, wait_seconds=self.wait_seconds)
        except MetadataError as exc:
            if exc.status == 404:
                self.first_answer.set()  # no such key here: nothing to wait for before starting
            self._failed(f"HTTP {exc.status}", slow=exc.status == 404)
            return False
        except TRANSPORT_ERRORS as exc:
            self._failed(type(exc).__name__ + (f": {exc}" if str(exc) else ""))
            return False
        if self.backoff.failures:
            log("INFO", "metadata server answering again", path=w.path, after_failures=self.backoff.failures)
        self.backoff.ok()
        self._last_reason = None
        notice, changed = w.on_answer(value, etag)
        if notice:
            log("WARNING", "notice from the metadata server", path=w.path, value=w.value, notice=w.notice)
            self.on_notice(w.notice, w.value or "")
            self.first_answer.set()  # after on_notice: whoever waits on it then sees the notice
            return True
        self.first_answer.set()
        if changed and w.value not in (None, "FALSE", "NONE"):
            log("INFO", "metadata value changed (no notice)", path=w.path, value=w.value)
        # Guard against a hot loop: no ETag to wait on, or a server answering at once without any change.
        if (etag is None or not changed) and time.monotonic() - started < self.min_cycle:
            self.stopped.wait(self.min_cycle)
        return False

    def _failed(self, reason: str, slow: bool = False) -> None:
        delay = 30.0 if slow else self.backoff.fail()
        # Quiet: the first failure of a streak, a new kind of failure, and every 20th.
        kind = reason.split(":")[0]
        if kind != self._last_reason or self.backoff.failures % 20 == 0 or slow:
            self._last_reason = kind
            log("WARNING", "metadata watch failed; reconnecting", path=self.watch.path, reason=reason,
                failures=self.backoff.failures, retry_in_s=delay)
        self.stopped.wait(delay)


class ValueWatcher(threading.Thread):
    """Follows one key that changes during the node's life (a multi-node member's generation, ATTR_GENERATION):
    every new value goes to `on_value`, the first read included. Errors back off as for the notice watchers; a key
    that is not set (404) is looked at again every few seconds."""

    def __init__(self, md: MetadataClient, path: str, on_value: Callable[[str], None], *, wait_seconds: float = 60.0):
        super().__init__(name=f"watch-{path.rsplit('/', 1)[-1]}", daemon=True)
        self.md, self.path, self.on_value, self.wait_seconds = md, path, on_value, wait_seconds
        self.stopped = threading.Event()
        self.backoff = Backoff()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        etag: str | None = None
        value: str | None = None
        while not self.stopped.is_set():
            try:
                new, etag = (self.md.read(self.path) if etag is None
                             else self.md.wait_for_change(self.path, etag, wait_seconds=self.wait_seconds))
            except MetadataError as exc:
                etag = None
                self.stopped.wait(5.0 if exc.status == 404 else self.backoff.fail())
                continue
            except TRANSPORT_ERRORS as exc:
                etag = None
                delay = self.backoff.fail()
                log("WARNING", "metadata watch failed; reconnecting", path=self.path, reason=type(exc).__name__,
                    retry_in_s=delay)
                self.stopped.wait(delay)
                continue
            self.backoff.ok()
            if new != value:
                value = new
                self.on_value(new)
            elif etag is None:
                self.stopped.wait(1.0)  # a server that sends no ETag: poll, never spin
