"""The Logging sink, played locally: entries that the deployed sink filter selects are published to a Pub/Sub
topic on the emulator, as the LogEntry JSON in the message data (what a real sink sends).

Use it as a SimServer's `audit_sink`:

    router = AuditRouter(project, topic="preemptions")       # PUBSUB_EMULATOR_HOST must be set
    sim = SimServer(project, audit_sink=router)

Fault knobs for the demo and the idempotency tests: `duplicates` publishes every routed entry that many extra
times; `drop_next(n)` / `drop_rate` lose entries before they are published (the sweep must catch those).
Selection uses respawn.audit.matches, the same definition deploy/ renders into the sink filter.
"""

from __future__ import annotations

import json
import random
import threading

from respawn import audit


class AuditRouter:
    def __init__(self, project: str, topic: str = "preemptions", *, duplicates: int = 0, drop_rate: float = 0.0,
                 seed: int = 0, create_topic: bool = True) -> None:
        from google.cloud import pubsub_v1

        self.project = project
        self.publisher = pubsub_v1.PublisherClient()
        self.topic_path = self.publisher.topic_path(project, topic)
        self.duplicates = duplicates
        self.drop_rate = drop_rate
        self._drop = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.published: list[dict] = []  # one per routed entry (not counting duplicates)
        self.dropped: list[dict] = []
        self.rejected: list[dict] = []  # entries the filter did not select
        if create_topic:
            from google.api_core import exceptions

            try:
                self.publisher.create_topic(name=self.topic_path)
            except exceptions.AlreadyExists:
                pass

    def drop_next(self, n: int) -> None:
        with self._lock:
            self._drop += n

    def __call__(self, entry: dict) -> None:
        if not audit.matches(entry, self.project):
            with self._lock:
                self.rejected.append(entry)
            return
        with self._lock:
            drop = self._drop > 0 or (self.drop_rate > 0 and self._rng.random() < self.drop_rate)
            if self._drop > 0:
                self._drop -= 1
            copies = 1 + self.duplicates
        if drop:
            with self._lock:
                self.dropped.append(entry)
            return
        data = json.dumps(entry).encode()
        attributes = {"logging.googleapis.com/timestamp": entry.get("timestamp", "")}
        for _ in range(copies):
            self.publisher.publish(self.topic_path, data, **attributes).result(timeout=30)
        with self._lock:
            self.published.append(entry)

    def close(self) -> None:
        self.publisher.stop()
