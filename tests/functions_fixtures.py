"""Fixtures for driving the control plane through its real entry points.

`controller` gives a Controller: the four Cloud Functions served in-process by the Functions Framework
(`create_app(...).test_client()`), real CloudEvents (Eventarc's protobuf Firestore event, Pub/Sub messages),
the Firestore and Pub/Sub emulators, and a SimServer reached through the real Compute/TPU clients. Import with:

    from functions_fixtures import controller  # noqa: F401
    from sim_fixtures import sim_factory, sim_server  # noqa: F401
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from respawn.contract import heartbeat_id
from respawn.schema import EVENTS, JOBS, NODES, JobStatus, State, parse_spec
from sim.bridges import pubsub_cloudevent

SOURCE = "functions/main.py"
ENTRY_POINTS = ("on_job_created", "on_log_event", "on_sweep", "on_alert")
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
T4 = "nvidia-tesla-t4"

# Short timings: the tests wait on real transitions, never on fixed sleeps.
FAST_ENV = {
    "RESPAWN_POLL_SECONDS": "0.05",
    "RESPAWN_POLL_BUDGET_SECONDS": "15",
    "RESPAWN_STALE_HEARTBEAT_SECONDS": "5",
    "RESPAWN_BOOT_GRACE_SECONDS": "30",
    "RESPAWN_BACKOFF_BASE_SECONDS": "1",
    "RESPAWN_SLACK_BACKOFF_SECONDS": "0.01",
}


def gpu_spec(job_id: str = "train", **over: Any) -> dict[str, Any]:
    spec = {
        "id": job_id,
        "accelerator": {"kind": "gpu", "machine_type": "n1-standard-8", "accelerator_type": T4},
        "provisioning": "spot",
        "zones": list(ZONES),
        "trainer": {"command": ["python", "-m", "respawn.ckpt.examples.torch_mlp"], "env": {"SEED": "1"}},
        "checkpoint_uri": f"gs://respawn-ckpt/{job_id}",
        "max_restarts": 5,
        "placement": {"cooldown_seconds": 300},
    }
    spec.update(over)
    return spec


def tpu_spec(job_id: str = "jax", **over: Any) -> dict[str, Any]:
    spec = gpu_spec(job_id, accelerator={"kind": "tpu", "accelerator_type": "v5litepod-8",
                                         "runtime_version": "v2-alpha-tpuv5-lite"})
    spec.update(over)
    return spec


def pubsub_event(body: Any, *, raw: bytes | None = None) -> tuple[dict, bytes]:
    """A structured Pub/Sub CloudEvent as Eventarc delivers it to a Pub/Sub-triggered function."""
    return pubsub_cloudevent(raw if raw is not None else json.dumps(body).encode())


def firestore_created_event(project: str, job_id: str, *, data: bytes | None = None) -> tuple[dict, bytes]:
    """Eventarc's google.cloud.firestore.document.v1.created: binary mode, protobuf DocumentEventData."""
    from google.events.cloud import firestore as fe

    if data is None:
        doc = fe.Document(name=f"projects/{project}/databases/(default)/documents/{JOBS}/{job_id}")
        data = fe.DocumentEventData.serialize(fe.DocumentEventData(value=doc))
    event = CloudEvent(
        {"type": "google.cloud.firestore.document.v1.created", "source": f"//firestore.googleapis.com/projects/{project}/databases/(default)",
         "id": str(uuid.uuid4()), "subject": f"documents/{JOBS}/{job_id}", "datacontenttype": "application/protobuf",
         "document": f"{JOBS}/{job_id}", "database": "(default)", "project": project, "location": "nam5"},
        data,
    )
    return to_binary(event)


class Controller:
    # The control plane's clock: every entry point's Deps.now, and the times this helper writes as an agent's, run
    # `ahead` seconds past the real one once a test advance()d it (a heartbeat going stale without a sleep).
    ahead: float = 0.0

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=self.ahead)

    def advance(self, seconds: float) -> None:
        """Move the control plane's clock `seconds` forward for the rest of the test: what a sweep then reads is
        `seconds` older, as if the test had slept that long."""
        self.ahead += seconds

    def __init__(self, project: str, db, nodes_db, sim, alerts_sub: str, sweep_topic: str):
        import functions_framework

        from sim.bridges import PushRelay

        self.project, self.db, self.nodes_db, self.sim, self.alerts_sub = project, db, nodes_db, sim, alerts_sub
        self.apps = {name: functions_framework.create_app(target=name, source=SOURCE, signature_type="cloudevent")
                     for name in ENTRY_POINTS}
        # The sweep topic's push subscription to on_sweep: the scheduled sweep's one message per job comes back here.
        self.sweep_topic = sweep_topic  # the nodes are told it too (NodeSettings.sweep_topic)
        self.sweep_relay = PushRelay(project, sweep_topic, lambda h, b: self.deliver("on_sweep", h, b), concurrency=16)

    # Delivering events through the Functions Framework.
    def deliver(self, target: str, headers: dict, body: bytes) -> int:
        response = self.apps[target].test_client().post("/", headers=headers, data=body)
        return response.status_code

    def job_created(self, job_id: str, **kw) -> int:
        return self.deliver("on_job_created", *firestore_created_event(self.project, job_id, **kw))

    def log_event(self, entry: Any, **kw) -> int:
        return self.deliver("on_log_event", *pubsub_event(entry, **kw))

    def sweep(self, job_id: str | None = None) -> int:
        """Cloud Scheduler's tick (job_id None), then every per-job message it fanned out, delivered as the sweep
        topic's push subscription would, each on its own thread; or the CLI's nudge of one job. The first non-200
        status, else 200."""
        if job_id:
            return self.deliver("on_sweep", *pubsub_event({"task": "sweep", "job_id": job_id}))
        statuses = [self.deliver("on_sweep", *pubsub_event({"task": "sweep"}))]
        statuses += [status for _, status in self.sweep_relay.drain()]
        return next((s for s in statuses if s != 200), 200)

    def notice(self, job_id: str, node: str, kind: str = "preempted") -> int:
        """The node agent's message on a notice (node_agent/nudge.py), as the sweep topic's push delivers it."""
        from respawn.contract import notice_nudge

        return self.deliver("on_sweep", *pubsub_event(notice_nudge(job_id, node, kind, self.now().isoformat())))

    def alert(self, alert: Any) -> int:
        return self.deliver("on_alert", *pubsub_event(alert))

    def concurrently(self, calls: list) -> list[int]:
        """Run each zero-argument call in its own thread at the same moment; their HTTP statuses."""
        results: list[Any] = [None] * len(calls)
        barrier = threading.Barrier(len(calls))

        def run(i, call):
            barrier.wait()
            results[i] = call()

        threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return results

    # Firestore, as the CLI and the node agent write it.
    def register(self, spec: dict[str, Any]) -> str:
        from google.cloud import firestore

        parsed = parse_spec(spec) if isinstance(spec, dict) and spec.get("zones") else None
        doc = parsed.to_doc() if parsed else spec
        self.db.collection(JOBS).document(spec["id"]).create({
            "spec": doc, "status": {"state": "PENDING", "revision": 0}, "cancel_requested": False,
            "created_at": firestore.SERVER_TIMESTAMP,
        })
        return spec["id"]

    def status(self, job_id: str) -> JobStatus:
        return JobStatus.model_validate(self.db.collection(JOBS).document(job_id).get().to_dict()["status"])

    def events(self, job_id: str) -> list[dict]:
        snaps = self.db.collection(JOBS).document(job_id).collection(EVENTS).stream()
        return sorted((s.to_dict() for s in snaps), key=lambda e: e["at"])

    def heartbeat(self, node: str, *, state: str = "training", step: int = 10, committed_step: int = 5,
                  age: float = 0, worker: int = 0, database: str | None = None, **kw) -> None:
        """Write nodes/{node} (a slice's other workers: nodes/{node}-w{worker}) as the agent does; `age` seconds
        in the past (a node that went silent). A trainer training past its committed step has stepped: its first
        step, and when, unless given (the recovery's end: recovery_time). `database`: another than the pool-less
        deployment's (a node identity's, deployment.heartbeat_database)."""
        from google.cloud import firestore

        job, _, attempt = node.rpartition("-")
        db = self.nodes_db if database is None else firestore.Client(project=self.project, database=database)
        at = self.now() - timedelta(seconds=age)
        if state == "training" and step is not None and step > (committed_step or 0):
            kw = {"first_step": step, "first_step_at": at, **kw}
        db.collection(NODES).document(heartbeat_id(node, worker)).set({
            "job_id": job, "attempt": int(attempt), "worker": worker, "state": state, "step": step,
            "committed_step": committed_step, "heartbeat_at": at, **kw})

    def cancel(self, job_id: str) -> None:
        self.db.collection(JOBS).document(job_id).update({"cancel_requested": True})

    def capacity(self) -> dict[str, dict]:
        return {s.id: s.to_dict() for s in self.db.collection("capacity").stream()}

    # Alerts published by the core, pulled from the emulator.
    def alerts(self, timeout: float = 5.0, want: int | None = None) -> list[dict]:
        from google.cloud import pubsub_v1

        sub = pubsub_v1.SubscriberClient()
        got: list[dict] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            resp = sub.pull(request={"subscription": self.alerts_sub, "max_messages": 50}, timeout=5)
            if resp.received_messages:
                sub.acknowledge(request={"subscription": self.alerts_sub,
                                         "ack_ids": [m.ack_id for m in resp.received_messages]})
                got += [json.loads(m.message.data) for m in resp.received_messages]
            if want is not None and len(got) >= want:
                break
            if want is None and not resp.received_messages and got:
                break
            if want is None and not resp.received_messages:
                time.sleep(0.1)
        sub.close()
        return got

    def system_events(self, node: str | None = None) -> list[dict]:
        """The audit entries the sim wrote that the Logging sink would route (respawn.audit's filter)."""
        from respawn import audit

        return [e for e in list(self.sim.audit_log) if audit.matches(e, self.project)
                and (node is None or e["protoPayload"]["resourceName"].endswith("/" + node))]

    def wait_system_event(self, node: str, timeout: float = 20) -> dict:
        self.sim.wait_for(lambda: bool(self.system_events(node)), timeout=timeout, what=f"a system event for {node}")
        return self.system_events(node)[-1]

    def live(self, job_id: str) -> list[dict]:
        """The job's nodes holding hardware now, as the sim sees them (with status, labels, metadata attributes)."""
        names = {(r["zone"], r["name"]) for r in self.sim.live_nodes(job_id)}
        return [n for n in self.sim.instances() if (n["zone"], n["name"]) in names]

    def wait_state(self, job_id: str, state: str, timeout: float = 30) -> JobStatus:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(job_id)
            if st.state is State(state):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {st.state.value} ({st.message}), not {state}")
            time.sleep(0.05)


@pytest.fixture
def controller(monkeypatch, firestore_db, nodes_db, pubsub_emulator, project, sim_server):
    from google.cloud import pubsub_v1

    topic_id = f"alerts-{uuid.uuid4().hex[:8]}"
    publisher = pubsub_v1.PublisherClient()
    topic = publisher.create_topic(name=f"projects/{project}/topics/{topic_id}").name
    subscriber = pubsub_v1.SubscriberClient()
    sub = subscriber.create_subscription(name=f"projects/{project}/subscriptions/{topic_id}", topic=topic).name
    subscriber.close()
    sweep_topic = f"sweep-{uuid.uuid4().hex[:8]}"
    env = {"RESPAWN_PROJECT": project, "RESPAWN_COMPUTE_ENDPOINT": sim_server.endpoint,
           "RESPAWN_MONITORING_ENDPOINT": sim_server.endpoint,
           "RESPAWN_TPU_ENDPOINT": sim_server.endpoint, "RESPAWN_BILLING_ENDPOINT": sim_server.endpoint,
           "RESPAWN_ALERTS_TOPIC": topic_id,
           "RESPAWN_SWEEP_TOPIC": sweep_topic, **FAST_ENV}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLACK_WEBHOOK_URL", raising=False)
    ctl = Controller(project, firestore_db, nodes_db, sim_server, sub, sweep_topic)
    # The entry points build their dependencies with Deps.default(): each reads the controller's clock.
    from respawn.control.reconcile import Deps

    default = Deps.default.__func__
    monkeypatch.setattr(Deps, "default", classmethod(
        lambda cls, settings=None: dataclasses.replace(default(cls, settings), now=ctl.now)))
    yield ctl
    ctl.sweep_relay.close()
