"""The heartbeat: what nodes/{node} says (composed purely from what the agent knows), and the thread that writes
it every `interval` seconds with backoff, so Firestore trouble never holds up anything else."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from respawn.contract import HEARTBEAT_SERVER_TIME_FIELDS, NODES_COLLECTION, Heartbeat, NodeState
from respawn.logs import log

from .firestore_rest import FirestoreError, FirestoreWriter
from .metadata import TRANSPORT_ERRORS


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def compose_heartbeat(*, job_id: str, attempt: int, zone: str | None, state: NodeState,
                      status: dict[str, Any] | None, started_at: datetime | None, notice: str | None = None,
                      exit_code: int | None = None, output_tail: str | None = None,
                      failed_command: list[str] | None = None, now: datetime | None = None,
                      worker: int = 0, generation: int | None = None, step_idle_seconds: float | None = None,
                      master_reachable: bool | None = None, env_cache: dict[str, Any] | None = None,
                      first_step: int | None = None, first_step_at: datetime | None = None,
                      emergency: dict[str, Any] | None = None) -> Heartbeat:
    """The nodes/{node} document (respawn.contract.Heartbeat) as a dict of Python values; datetimes stay datetimes
    for the Firestore encoder. `status` is the trainer's status file (respawn.contract.read_status), or None before
    it exists; values of the wrong type in it are left out (None), never passed on. `failed_command` (argv) goes
    with state SETUP_FAILED, beside `exit_code` and `output_tail` of that command. `worker` is this host's index in a
    multi-host TPU slice (the document is nodes/{heartbeat_id(node, worker)}); `generation` the number of the
    generation a multi-node member's trainer runs or last ran; `step_idle_seconds` and `master_reachable` what
    node_agent/reach.py measured (respawn.contract.Heartbeat says what they mean); `env_cache` the environment
    cache's state (envcache.EnvCache.status); `emergency` the save's outcome after a notice (save_outcome.py), else
    the status file's."""
    status = status or {}
    emergency = emergency if emergency is not None else status.get("emergency")
    return {
        "job_id": str(job_id),
        "attempt": int(attempt),
        "worker": int(worker),
        "zone": zone,
        "state": NodeState(state),
        "step": _int_or_none(status.get("step")),
        "committed_step": _int_or_none(status.get("committed_step")),
        "total_steps": _int_or_none(status.get("total_steps")),
        "exit_code": exit_code,
        "output_tail": output_tail,
        "failed_command": [str(a) for a in failed_command] if failed_command is not None else None,
        "notice": notice,
        "emergency": dict(emergency) if isinstance(emergency, dict) else None,
        "started_at": started_at,
        "first_step": first_step,
        "first_step_at": first_step_at,
        "generation": generation,
        "step_idle_seconds": None if step_idle_seconds is None else round(float(step_idle_seconds), 3),
        "master_reachable": master_reachable,
        "env_cache": dict(env_cache) if env_cache is not None else None,
        "heartbeat_at": now or datetime.now(timezone.utc),
    }


class Heartbeater(threading.Thread):
    """Writes `snapshot()` to nodes/{doc_id} every `interval` s (doc_id: respawn.contract.heartbeat_id). Failures back off (1 s doubling, capped at four
    intervals) and are logged once per streak. `stop_periodic()` ends the loop; `write()` is the one-off write
    the notice and exit paths use, serialised with the periodic one so that an older state never lands last;
    `nudge()` makes the periodic loop write now (a new state such as `preparing` need not wait a whole interval)."""

    def __init__(self, writer: FirestoreWriter, node: str, snapshot: Callable[[], Heartbeat], *,
                 interval: float):
        super().__init__(name="heartbeat", daemon=True)
        self.writer, self.node, self.snapshot, self.interval = writer, node, snapshot, interval
        self._halt = threading.Event()
        self._wake = threading.Event()  # set by nudge() and stop_periodic(): end the current wait early
        self._write_lock = threading.Lock()
        self.writes = 0
        # The monotonic time at which the newest beat that landed was composed (wait_landed).
        self._landed = threading.Condition()
        self._landed_composed_at = float("-inf")

    def stop_periodic(self) -> None:
        self._halt.set()
        self._wake.set()

    def nudge(self) -> None:
        self._wake.set()

    def _pause(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def run(self) -> None:
        delay_on_error, failures = 1.0, 0
        while not self._halt.is_set():
            try:
                composed_at = time.monotonic()
                self.write(self.snapshot(), timeout=min(5.0, max(1.0, self.interval)), lock_timeout=0,
                           composed_at=composed_at)
            except (FirestoreError, *TRANSPORT_ERRORS) as exc:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log("WARNING", "heartbeat write failed; backing off", node=self.node, error=str(exc) or repr(exc),
                        failures=failures, retry_in_s=delay_on_error)
                self._pause(delay_on_error)
                delay_on_error = min(delay_on_error * 2, 4 * self.interval)
                continue
            if failures:
                log("INFO", "heartbeat writes working again", node=self.node, after_failures=failures)
            failures, delay_on_error = 0, 1.0
            self._pause(self.interval)

    def write(self, doc: Heartbeat, *, timeout: float, lock_timeout: float = -1,
              composed_at: float | None = None) -> bool:
        """One write. Returns False without writing if another write holds the lock past `lock_timeout` (0 for
        the periodic loop: skip a beat rather than queue behind a final write); raises on failure. `composed_at`:
        the monotonic time just before `doc` was composed (for wait_landed)."""
        if not self._write_lock.acquire(timeout=lock_timeout):  # -1: wait as long as it takes
            return False
        try:
            if self._halt.is_set() and lock_timeout == 0:
                return False  # the periodic loop was stopped while this beat was being composed
            self.writer.set(NODES_COLLECTION, self.node, dict(doc), server_timestamps=HEARTBEAT_SERVER_TIME_FIELDS,
                            timeout=timeout)
            self.writes += 1
        finally:
            self._write_lock.release()
        if composed_at is not None:
            with self._landed:
                self._landed_composed_at = max(self._landed_composed_at, composed_at)
                self._landed.notify_all()
        return True

    def wait_landed(self, since: float, timeout: float) -> bool:
        """Wait until a beat composed at or after the monotonic time `since` has been written (so it carries
        whatever the agent's state was at `since`); False after `timeout`."""
        with self._landed:
            return self._landed.wait_for(lambda: self._landed_composed_at >= since, timeout)

    def write_until(self, make_doc: Callable[[], Heartbeat], deadline: float, *, what: str) -> bool:
        """Retry a one-off write until it lands or the monotonic `deadline` passes. True if written."""
        delay = 0.2
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log("ERROR", f"{what} heartbeat not written before the deadline", node=self.node)
                return False
            try:
                composed_at = time.monotonic()
                doc = make_doc()
                if self.write(doc, timeout=max(0.5, min(5.0, remaining)), lock_timeout=remaining,
                              composed_at=composed_at):
                    log("INFO", f"{what} heartbeat written", node=self.node, state=doc["state"],
                        committed_step=doc["committed_step"], exit_code=doc["exit_code"])
                    return True
            except (FirestoreError, *TRANSPORT_ERRORS) as exc:
                log("WARNING", f"{what} heartbeat write failed; retrying", node=self.node,
                    error=str(exc) or repr(exc))
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)
