"""Eventarc and Cloud Scheduler, played locally.

EventarcBridge: watches the `jobs` collection on the Firestore emulator (on_snapshot) and delivers each newly
created document to a function URL as the CloudEvent Eventarc sends for
`google.cloud.firestore.document.v1.created`: binary mode (ce-* headers), content-type application/protobuf, the
body a serialized `google.events.cloud.firestore.DocumentEventData`. A delivery that does not answer 2xx is
retried (as with `--retry`) up to `max_attempts`.

pubsub_cloudevent: a Pub/Sub message as Eventarc delivers it to a Pub/Sub-triggered function (in-process callers:
tests and bench/controller.py).

PushRelay: a Pub/Sub push subscription played in-process (tests and benchmarks serve the functions in-process, with
no port for a real push subscription to post to): `drain()` delivers every message waiting on a topic, and every
message those deliveries publish there in turn, each as `pubsub_cloudevent` shapes it, many at once. The demo
serves the functions on ports and uses the emulator's own push subscriptions instead.

SweepScheduler: publishes `{"task": "sweep"}` to a Pub/Sub topic every `interval` seconds, as the
`gcloud scheduler jobs create pubsub sweep` job does; `fire()` publishes one at once. While it runs, its job
(`region`, respawn.deployment.SCHEDULER_JOB) is Cloud Scheduler's to the sims of this process (sim/cloud_scheduler.py):
jobs.get describes it, jobs.pause stops its ticks, jobs.resume starts them again.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
import time
import uuid

import requests
from google.events.cloud import firestore as events
from google.protobuf import timestamp_pb2

from sim import cloud_scheduler

EVENT_TYPE = "google.cloud.firestore.document.v1.created"
DATA_SCHEMA = "https://github.com/googleapis/google-cloudevents/blob/main/proto/google/events/cloud/firestore/v1/data.proto"


def to_value(v, root: str) -> events.Value:
    """A Python value as read from Firestore, as a google.events Firestore Value. `root` is
    `projects/P/databases/D/documents`, the prefix of reference values."""
    from google.cloud.firestore_v1 import DocumentReference, GeoPoint

    if v is None:
        return events.Value(null_value=0)
    if isinstance(v, bool):
        return events.Value(boolean_value=v)
    if isinstance(v, int):
        return events.Value(integer_value=v)
    if isinstance(v, float):
        return events.Value(double_value=v)
    if isinstance(v, str):
        return events.Value(string_value=v)
    if isinstance(v, bytes):
        return events.Value(bytes_value=v)
    if isinstance(v, dt.datetime):
        ts = timestamp_pb2.Timestamp()
        ts.FromDatetime(v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc))
        return events.Value(timestamp_value=ts)
    if isinstance(v, DocumentReference):
        return events.Value(reference_value=f"{root}/{v.path}")
    if isinstance(v, GeoPoint):
        from google.type import latlng_pb2

        return events.Value(geo_point_value=latlng_pb2.LatLng(latitude=v.latitude, longitude=v.longitude))
    if isinstance(v, dict):
        return events.Value(map_value=events.MapValue(fields={k: to_value(x, root) for k, x in v.items()}))
    if isinstance(v, (list, tuple)):
        return events.Value(array_value=events.ArrayValue(values=[to_value(x, root) for x in v]))
    raise TypeError(f"cannot encode a {type(v).__name__} as a Firestore value")


def document_event_data(snapshot, project: str, database: str = "(default)") -> bytes:
    """The serialized DocumentEventData of a created document: `value` set, no `old_value`."""
    root = f"projects/{project}/databases/{database}/documents"
    doc = events.Document(
        name=f"{root}/{snapshot.reference.path}",
        fields={k: to_value(v, root) for k, v in (snapshot.to_dict() or {}).items()},
    )
    for attr, field in (("create_time", "create_time"), ("update_time", "update_time")):
        t = getattr(snapshot, attr, None)
        if t is not None:
            ts = timestamp_pb2.Timestamp()
            ts.FromDatetime(t)
            setattr(doc, field, ts)
    return events.DocumentEventData.serialize(events.DocumentEventData(value=doc))


def cloudevent_headers(project: str, document_path: str, *, database: str = "(default)", location: str = "nam5",
                       event_id: str | None = None) -> dict:
    return {
        "ce-specversion": "1.0",
        "ce-id": event_id or str(uuid.uuid4()),
        "ce-type": EVENT_TYPE,
        "ce-source": f"//firestore.googleapis.com/projects/{project}/databases/{database}",
        "ce-subject": f"documents/{document_path}",
        "ce-time": dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z"),
        "ce-dataschema": DATA_SCHEMA,
        "ce-project": project,
        "ce-database": database,
        "ce-namespace": "(default)",
        "ce-document": document_path,
        "ce-location": location,
        "content-type": "application/protobuf",
    }


def pubsub_cloudevent(data: bytes, topic: str = "projects/p/topics/t") -> tuple[dict, bytes]:
    """(headers, body) of the structured CloudEvent `google.cloud.pubsub.topic.v1.messagePublished` for `data`."""
    from cloudevents.conversion import to_structured
    from cloudevents.http import CloudEvent

    event = CloudEvent(
        {"type": "google.cloud.pubsub.topic.v1.messagePublished", "source": f"//pubsub.googleapis.com/{topic}",
         "id": str(uuid.uuid4())},
        {"message": {"data": base64.b64encode(data).decode(), "messageId": str(uuid.uuid4()),
                     "publishTime": dt.datetime.now(dt.timezone.utc).isoformat()},
         "subscription": "projects/p/subscriptions/s"},
    )
    return to_structured(event)


class EventarcBridge:
    def __init__(self, project: str, function_url: str, *, collection: str = "jobs", database: str = "(default)",
                 location: str = "nam5", include_existing: bool = False, max_attempts: int = 5,
                 retry_delay: float = 0.5) -> None:
        self.project = project
        self.function_url = function_url
        self.collection = collection
        self.database = database
        self.location = location
        self.include_existing = include_existing
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.deliveries: list[dict] = []  # {document, event_id, attempts, status}
        self._lock = threading.Lock()
        self._seen_first = threading.Event()
        self._watch = None
        self._client = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, timeout: float = 30) -> "EventarcBridge":
        from google.cloud import firestore

        self._client = firestore.Client(project=self.project, database=self.database)
        self._watch = self._client.collection(self.collection).on_snapshot(self._on_snapshot)
        if not self._seen_first.wait(timeout):
            raise RuntimeError(f"the Firestore watch on '{self.collection}' gave no first snapshot within {timeout} s; "
                               "is FIRESTORE_EMULATOR_HOST set and the emulator running?")
        return self

    def _on_snapshot(self, docs, changes, read_time) -> None:
        first = not self._seen_first.is_set()
        for change in changes:
            if change.type.name != "ADDED" or (first and not self.include_existing):
                continue
            t = threading.Thread(target=self._deliver, args=(change.document,), daemon=True,
                                 name=f"eventarc-{change.document.id}")
            self._threads.append(t)
            t.start()
        self._seen_first.set()

    def _deliver(self, snapshot) -> None:
        path = snapshot.reference.path
        event_id = str(uuid.uuid4())
        body = document_event_data(snapshot, self.project, self.database)
        record = {"document": path, "event_id": event_id, "attempts": 0, "status": None}
        with self._lock:
            self.deliveries.append(record)
        delay = self.retry_delay
        while record["attempts"] < self.max_attempts and not self._stopped.is_set():
            record["attempts"] += 1
            headers = cloudevent_headers(self.project, path, database=self.database, location=self.location,
                                         event_id=event_id)
            try:
                status = requests.post(self.function_url, data=body, headers=headers, timeout=60).status_code
            except requests.RequestException as exc:
                status = f"error: {exc.__class__.__name__}"
            record["status"] = status
            if isinstance(status, int) and 200 <= status < 300:
                return
            self._stopped.wait(delay)
            delay = min(delay * 2, 10)

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.unsubscribe()
        for t in self._threads:
            t.join(timeout=5)
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> "EventarcBridge":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class PushRelay:
    """Delivers the messages of `topic` to `deliver(headers, body) -> HTTP status`, `concurrency` at a time, as a
    push subscription delivers to a function of max instances x concurrency (the default: the deployed 10 x 8).
    A message is acknowledged when it is pulled; its delivery's status is what drain() reports (no redelivery), and
    `on_done(message as JSON, status)`, when given, hears of each delivery as it ends."""

    def __init__(self, project: str, topic: str, deliver, *, concurrency: int = 80, create_topic: bool = True,
                 on_done=None) -> None:
        from google.api_core import exceptions
        from google.cloud import pubsub_v1

        self.deliver = deliver
        self.on_done = on_done
        self.concurrency = concurrency
        self.topic_path = pubsub_v1.PublisherClient.topic_path(project, topic)
        self.subscriber = pubsub_v1.SubscriberClient()
        if create_topic:
            publisher = pubsub_v1.PublisherClient()
            try:
                publisher.create_topic(name=self.topic_path)
            except exceptions.AlreadyExists:
                pass
        self.subscription = self.subscriber.create_subscription(
            name=self.subscriber.subscription_path(project, f"{topic}-relay-{uuid.uuid4().hex[:8]}"),
            topic=self.topic_path, ack_deadline_seconds=600).name

    def pull(self) -> list[bytes]:
        """Every message waiting now (acknowledged). The emulator answers return_immediately pulls at once with what
        it holds, so a message whose publish has returned is in the first pulls that follow."""
        import warnings

        out: list[bytes] = []
        while True:
            with warnings.catch_warnings():  # deprecated for the real service (it may answer empty while messages
                # wait); the emulator answers with what it holds, which is what a drain needs to know it is done
                warnings.filterwarnings("ignore", "The return_immediately flag is deprecated", DeprecationWarning)
                resp = self.subscriber.pull(request={"subscription": self.subscription, "max_messages": 1000,
                                                     "return_immediately": True}, timeout=30)
            if not resp.received_messages:
                return out
            self.subscriber.acknowledge(request={"subscription": self.subscription,
                                                 "ack_ids": [m.ack_id for m in resp.received_messages]})
            out += [m.message.data for m in resp.received_messages]

    def drain(self) -> list[tuple[dict, int]]:
        """Deliver until the topic is empty; (message body as JSON, HTTP status) of each delivery, in pull order."""
        from concurrent.futures import ThreadPoolExecutor

        def one(data: bytes) -> tuple[dict, int]:
            status = self.deliver(*pubsub_cloudevent(data, self.topic_path))
            message = json.loads(data)
            if self.on_done is not None:
                self.on_done(message, status)
            return message, status

        done: list[tuple[dict, int]] = []
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            while True:
                waiting = self.pull()
                if not waiting:
                    return done
                done += list(pool.map(one, waiting))

    def close(self) -> None:
        self.subscriber.delete_subscription(request={"subscription": self.subscription})
        self.subscriber.close()


class SweepScheduler:
    def __init__(self, project: str, topic: str = "sweep", *, interval: float = 300,
                 message: dict | None = None, create_topic: bool = True, region: str = "us-central1") -> None:
        from google.cloud import pubsub_v1

        self.publisher = pubsub_v1.PublisherClient()
        self.topic_path = self.publisher.topic_path(project, topic)
        self.interval = interval
        self.data = json.dumps(message or {"task": "sweep"}).encode()
        self.job = cloud_scheduler.SchedulerJob(cloud_scheduler.job_name(project, region), self.topic_path, self.data)
        self.fired = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        if create_topic:
            from google.api_core import exceptions

            try:
                self.publisher.create_topic(name=self.topic_path)
            except exceptions.AlreadyExists:
                pass

    def fire(self) -> None:
        self.publisher.publish(self.topic_path, self.data).result(timeout=30)
        self.fired += 1

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stopped.wait(max(0.0, next_at - time.monotonic())):
            if self.job.state == cloud_scheduler.ENABLED:
                self.fire()
            next_at += self.interval

    def start(self) -> "SweepScheduler":
        cloud_scheduler.register(self.job)
        self._thread = threading.Thread(target=self._run, name="sweep-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The scheduler gone: no tick, and its job deleted."""
        cloud_scheduler.unregister(self.job)
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "SweepScheduler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
