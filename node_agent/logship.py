"""Per-attempt logs that outlive the node: the setup's output (setup.log), the trainer's (trainer.log) and the
agent's own JSON lines (agent.log) are sent in chunks to the job's checkpoint_uri as they grow
(respawn.contract.LogChunk names them: {checkpoint_uri}/.respawn-logs/{attempt}/{host}/{stream}/{offset}.log), so
`respawn jobs logs` reads what a preempted node said after the node is gone.

A chunk goes at least every LOG_FLUSH_SECONDS while a stream grows, at once when LOG_CHUNK_BYTES are waiting, and
ends at a line's end (a final flush sends the rest). Where each stream has been sent up to is kept in logship.json
on the node's disk, so a restarted agent (or a restart in place) goes on from there; a chunk that was sent but not
recorded is sent again under the same name, whole, and replaces the first. Each chunk sent also goes to Cloud
Logging as labelled entries where the job asks for it (cloudlog.py; logs.cloud_logging). On a notice the periodic
sending stops (the emergency save and the final heartbeat come first); final_flush() then sends the rest within a
bound. A failed send is one WARNING per streak and is tried again at the next flush: logs never hold anything else
up.
"""

from __future__ import annotations

import json
import os
import threading
import time

from respawn import contract
from respawn.logs import log

from .cloudlog import CloudLog
from .metadata import TRANSPORT_ERRORS
from .prepare import SETUP_LOG
from .storage import UploadError, Uploader
from .supervisor import LOG_FILE

AGENT_LOG = "agent.log"  # the agent's own lines: main.py tees its stdout there
STATE_FILE = "logship.json"
STREAM_FILES = dict(zip(contract.LOG_STREAMS, (SETUP_LOG, LOG_FILE, AGENT_LOG)))  # each stream's file in the node dir
POLL_S = 0.5  # how often the thread looks whether a stream has a full chunk waiting


class LogShipper:
    def __init__(self, uploader: Uploader, checkpoint_uri: str, node_dir: str, *, job_id: str, attempt: int,
                 host: str, flush_seconds: float = contract.LOG_FLUSH_SECONDS,
                 chunk_bytes: int = contract.LOG_CHUNK_BYTES, cloud: CloudLog | None = None):
        self.uploader, self.node_dir, self.cloud = uploader, node_dir, cloud
        self.base = contract.logs_uri(checkpoint_uri)
        self.to = f"{contract.logs_uri(checkpoint_uri, attempt)}{host}/"
        self.job_id, self.attempt, self.host = job_id, attempt, host
        self.flush_seconds, self.chunk_bytes = flush_seconds, chunk_bytes
        self.offsets = self._load()
        self._lock = threading.Lock()  # one send at a time: the thread's, or the final flush's
        self._halt = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)

    def uri(self, stream: str, offset: int) -> str:
        return self.base + contract.LogChunk(self.attempt, self.host, stream, offset).name()

    def start(self) -> "LogShipper":
        log("INFO", "shipping this node's logs", to=self.to, streams=list(STREAM_FILES), flush_seconds=self.flush_seconds, chunk_bytes=self.chunk_bytes)
        self._thread.start()
        return self

    def stop(self, wait: float = 0.0) -> None:
        """No more periodic sends (a notice: the save comes first). With `wait`, a send in flight is given that long
        to finish and be recorded in logship.json (SIGHUP: the next agent goes on from there)."""
        self._halt.set()
        if wait > 0 and self._lock.acquire(timeout=wait):
            self._lock.release()

    def final_flush(self, seconds: float) -> bool:
        """Send what is left, partial last lines included, for at most `seconds`; True when all of it went."""
        self.stop()
        deadline = time.monotonic() + seconds
        if not self._lock.acquire(timeout=max(0.0, seconds)):
            log("WARNING", "final log flush skipped: a send still runs", seconds=seconds)
            return False
        try:
            done = self._ship(final=True, deadline=deadline)
        finally:
            self._lock.release()
        if not done:
            log("WARNING", "final log flush incomplete: what was not sent stays on the node's disk",
                seconds=seconds, pending_bytes=self._pending())
        return done

    # --- the thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        last = time.monotonic()
        while not self._halt.wait(POLL_S):
            if time.monotonic() - last < self.flush_seconds and self._pending(largest=True) < self.chunk_bytes:
                continue
            last = time.monotonic()
            with self._lock:
                if not self._halt.is_set():
                    self._ship(final=False, deadline=None)

    def _size(self, stream: str) -> int:
        try:
            return os.path.getsize(os.path.join(self.node_dir, STREAM_FILES[stream]))
        except OSError:
            return 0

    def _pending(self, largest: bool = False) -> int:
        waiting = [max(0, self._size(s) - self.offsets.get(s, 0)) for s in STREAM_FILES]
        return max(waiting) if largest else sum(waiting)

    def _ship(self, *, final: bool, deadline: float | None) -> bool:
        """Send every stream's new bytes in chunks; False when a send failed or the deadline came first. What went
        to the bucket then goes to Cloud Logging, in the time left: the bucket's copy comes first."""
        sent: list[tuple[str, bytes]] = []
        try:
            return self._send(sent, final=final, deadline=deadline)
        finally:
            if self.cloud is not None:
                for stream, data in sent:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left < 0.1:
                        break
                    self.cloud.write(stream, data, timeout=left)

    def _send(self, sent: list, *, final: bool, deadline: float | None) -> bool:
        for stream, file in STREAM_FILES.items():
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if not final and self._halt.is_set():
                    return True  # stopped: the rest goes with the final flush, or with the next agent
                offset = self.offsets.get(stream, 0)
                data = self._read(os.path.join(self.node_dir, file), offset)
                if not final and len(data) < self.chunk_bytes:
                    data = data[:data.rfind(b"\n") + 1]  # whole lines only; the rest goes with the next chunk
                if not data:
                    break
                if deadline is not None:
                    self.uploader.timeout = max(0.1, deadline - time.monotonic())
                try:
                    self.uploader.put(self.uri(stream, offset), data)
                except (UploadError, *TRANSPORT_ERRORS) as exc:
                    if not self._failing:
                        log("WARNING", "cannot ship logs; they stay on the node's disk and are sent again at the "
                                       "next flush", uri=self.uri(stream, offset), error=str(exc) or repr(exc))
                    self._failing = True
                    return False
                if self._failing:
                    log("INFO", "shipping logs again", stream=stream)
                    self._failing = False
                self.offsets[stream] = offset + len(data)
                self._save()
                sent.append((stream, data))
        return True

    def _read(self, path: str, offset: int) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(self.chunk_bytes)
        except OSError:
            return b""

    # --- where each stream was sent up to (logship.json) -----------------------------------------------------

    def _load(self) -> dict[str, int]:
        try:
            with open(os.path.join(self.node_dir, STATE_FILE)) as f:
                state = json.load(f)
            if (state.get("job_id"), state.get("attempt"), state.get("host")) == (self.job_id, self.attempt,
                                                                                   self.host):
                return {s: int(state["offsets"].get(s, 0)) for s in STREAM_FILES}
        except FileNotFoundError:
            return {s: 0 for s in STREAM_FILES}  # a fresh node: its files are its own
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
            log("WARNING", "ignoring an unreadable log-shipping record; shipping from the streams' ends",
                path=os.path.join(self.node_dir, STATE_FILE), error=str(exc))
        # Another job's or attempt's record: what the files hold now is theirs, not this attempt's.
        return {s: self._size(s) for s in STREAM_FILES}

    def _save(self) -> None:
        path = os.path.join(self.node_dir, STATE_FILE)
        try:
            with open(path + ".tmp", "w") as f:
                json.dump({"job_id": self.job_id, "attempt": self.attempt, "host": self.host,
                           "offsets": self.offsets}, f)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log("WARNING", "cannot record how far the logs were shipped; a restarted agent sends some again",
                path=path, error=str(exc))
