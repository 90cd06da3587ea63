"""Eventarc and Cloud Scheduler bridges (against the Firestore and Pub/Sub emulators) and the Slack receiver."""

from __future__ import annotations

import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from cloudevents.http import from_http
from google.cloud import pubsub_v1
from google.events.cloud import firestore as events

from sim.bridges import EVENT_TYPE, EventarcBridge, SweepScheduler
from sim.slack import SlackReceiver


class Recorder:
    """A stand-in function endpoint that records every request; answers `statuses` in turn, then 200."""

    def __init__(self, statuses=()):
        self.requests: list[tuple[dict, bytes]] = []
        self.statuses = list(statuses)
        self.cond = threading.Condition()
        rec = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with rec.cond:
                    rec.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    status = rec.statuses.pop(0) if rec.statuses else 200
                    rec.cond.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def wait(self, n, timeout=30):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.requests) >= n, timeout), f"got {len(self.requests)} of {n} requests"
        return self.requests

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    rec = Recorder()
    yield rec
    rec.stop()


def test_created_job_document_arrives_as_a_firestore_created_cloudevent(firestore_db, project, recorder, tmp_path):
    firestore_db.collection("jobs").document("old-job").set({"spec": {"x": 1}})  # existed before: no event
    with EventarcBridge(project, recorder.url):
        firestore_db.collection("jobs").document("job-a").set(
            {"spec": {"zones": ["us-central1-a", "us-central1-b"], "max_restarts": 3, "spot": True, "ratio": 0.5},
             "cancel_requested": False, "note": None})
        [(headers, body)] = recorder.wait(1)
    event = from_http(headers, body)
    assert event["type"] == EVENT_TYPE
    assert event["source"] == f"//firestore.googleapis.com/projects/{project}/databases/(default)"
    assert event["subject"] == "documents/jobs/job-a"
    assert event["document"] == "jobs/job-a" and event["database"] == "(default)" and event["project"] == project
    assert headers["content-type"] == "application/protobuf"
    data = events.DocumentEventData()
    data._pb.ParseFromString(event.data)  # as functions decode it (gcp-facts §5)
    assert data.value.name == f"projects/{project}/databases/(default)/documents/jobs/job-a"
    spec = data.value.fields["spec"].map_value.fields
    assert [v.string_value for v in spec["zones"].array_value.values] == ["us-central1-a", "us-central1-b"]
    assert spec["max_restarts"].integer_value == 3 and spec["spot"].boolean_value and spec["ratio"].double_value == 0.5
    assert data.value.fields["cancel_requested"].boolean_value is False
    assert "note" in data.value.fields and not data._pb.HasField("old_value")
    assert data.value.create_time.timestamp() > 0

    # the Functions Framework accepts the same request for a cloudevent function
    import functions_framework

    src = tmp_path / "main.py"
    out = tmp_path / "seen.txt"
    src.write_text(textwrap.dedent(f"""
        import functions_framework
        from google.events.cloud import firestore

        @functions_framework.cloud_event
        def on_job(cloud_event):
            p = firestore.DocumentEventData()
            p._pb.ParseFromString(cloud_event.data)
            open({str(out)!r}, "w").write(p.value.name + " " + cloud_event["type"])
    """))
    client = functions_framework.create_app(target="on_job", source=str(src), signature_type="cloudevent").test_client()
    resp = client.post("/", headers={k: v for k, v in headers.items() if k.startswith("ce-") or k == "content-type"},
                       data=body)
    assert resp.status_code == 200, resp.data
    assert out.read_text() == f"projects/{project}/databases/(default)/documents/jobs/job-a {EVENT_TYPE}"


def test_failed_delivery_is_retried_with_the_same_event_id(firestore_db, project):
    rec = Recorder(statuses=[500, 503])
    try:
        with EventarcBridge(project, rec.url, retry_delay=0.05) as bridge:
            firestore_db.collection("jobs").document("job-b").set({"spec": {}})
            reqs = rec.wait(3)
            ids = {h["ce-id"] for h, _ in reqs}
            assert len(ids) == 1
            bridge_records = bridge.deliveries
        assert bridge_records[0]["attempts"] == 3 and bridge_records[0]["status"] == 200
    finally:
        rec.stop()


def test_sweep_scheduler_publishes_sweep_messages(pubsub_emulator, project):
    subscriber = pubsub_v1.SubscriberClient()
    with SweepScheduler(project, topic="sweep-test", interval=0.1) as sched:
        sub = subscriber.subscription_path(project, "sweep-test-sub")
        subscriber.create_subscription(name=sub, topic=sched.topic_path)
        sched.fire()
        got = []
        while len(got) < 2:
            resp = subscriber.pull(subscription=sub, max_messages=10, timeout=10)
            got.extend(resp.received_messages)
        subscriber.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in got])
    assert all(json.loads(m.message.data) == {"task": "sweep"} for m in got)


def test_slack_receiver_records_answers_ok_and_fails_on_request():
    with SlackReceiver() as slack:
        payload = {"text": "fallback", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*VM* preempted"}}]}
        r = requests.post(slack.url, json=payload, timeout=5)
        assert (r.status_code, r.text) == (200, "ok")
        slack.fail(429, count=1, retry_after=2)
        r = requests.post(slack.url, json={"text": "second"}, timeout=5)
        assert (r.status_code, r.text, r.headers["Retry-After"]) == (429, "rate_limited", "2")
        r = requests.post(slack.url, json={"text": "second"}, timeout=5)
        assert r.status_code == 200
        slack.fail(500)
        assert requests.post(slack.url, json={"text": "x"}, timeout=5).status_code == 500
        assert requests.post(slack.url, json={"text": "x"}, timeout=5).text == "rollup_error"
        slack.recover()
        assert slack.wait_for(2) == [payload, {"text": "second"}]
        assert [r["status"] for r in slack.requests] == [200, 429, 200, 500, 500]
