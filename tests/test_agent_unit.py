"""The node agent's pure parts: settings parsing, the watch state machine, heartbeat composition, Firestore value
encoding, status reading, output tails. No servers, no processes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from respawn.agent.config import ConfigError, parse_attempt, parse_settings, zone_from_metadata
from respawn.agent.firestore_rest import encode_value
from respawn.agent.heartbeat import compose_heartbeat
from respawn.agent.metadata import metadata_host
from respawn.agent.supervisor import log_tail, normalize_exit
from respawn.agent.watcher import Backoff, is_preempted, is_terminating_maintenance, maintenance_watch, preempted_watch
from respawn.contract import ATTR_ATTEMPT, ATTR_SETTINGS, HEARTBEAT_FIELDS, NodeState, read_status
from respawn.schema import Heartbeat

GOOD = {"command": ["python", "train.py"], "checkpoint_uri": "gs://bucket/run"}


def test_settings_defaults_and_values():
    s = parse_settings(json.dumps({**GOOD, "env": {"A": "1"}, "heartbeat_seconds": 5, "future_key": True}))
    assert s.command == ("python", "train.py") and s.env == {"A": "1"}
    assert s.heartbeat_seconds == 5 and s.notice_budget_seconds == 25 and s.metadata_wait_seconds == 60


@pytest.mark.parametrize("raw, words", [
    ("not json", "not valid JSON"),
    ("[1]", "JSON object"),
    (json.dumps({**GOOD, "command": "python train.py"}), "argv list"),
    (json.dumps({**GOOD, "command": []}), "argv list"),
    (json.dumps({**GOOD, "checkpoint_uri": "s3://x"}), "checkpoint_uri"),
    (json.dumps({**GOOD, "env": {"A": 1}}), "env"),
    (json.dumps({**GOOD, "notice_budget_seconds": 0}), "notice_budget_seconds"),
    (json.dumps({**GOOD, "heartbeat_seconds": True}), "heartbeat_seconds"),
])
def test_bad_settings_name_the_attribute_and_the_problem(raw, words):
    with pytest.raises(ConfigError) as exc:
        parse_settings(raw)
    assert exc.value.attribute == ATTR_SETTINGS
    assert ATTR_SETTINGS in str(exc.value) and words in str(exc.value)


def test_attempt_and_zone():
    assert parse_attempt(" 7\n") == 7
    for bad in ("0", "x", "-1"):
        with pytest.raises(ConfigError) as exc:
            parse_attempt(bad)
        assert exc.value.attribute == ATTR_ATTEMPT
    assert zone_from_metadata("projects/123456/zones/europe-west4-a") == "europe-west4-a"
    assert zone_from_metadata("us-central1-b") == "us-central1-b"


def test_metadata_host_follows_google_auth():
    assert metadata_host({}) == "metadata.google.internal"
    assert metadata_host({"GCE_METADATA_ROOT": "a:1"}) == "a:1"
    assert metadata_host({"GCE_METADATA_HOST": "b:2", "GCE_METADATA_ROOT": "a:1"}) == "b:2"


def test_notice_values():
    assert is_preempted("TRUE") and is_preempted("true\n") and not is_preempted("FALSE")
    assert is_terminating_maintenance("TERMINATE_ON_HOST_MAINTENANCE")
    assert is_terminating_maintenance("SHUTDOWN_ON_HOST_MAINTENANCE")
    assert not is_terminating_maintenance("MIGRATE_ON_HOST_MAINTENANCE")
    assert not is_terminating_maintenance("NONE")


def test_watch_reads_once_then_waits_on_the_etag():
    w = preempted_watch()
    assert w.wants_plain_read()  # never wait before the first read: the key may already be TRUE
    assert w.on_answer("FALSE", "e1") == (False, True)
    assert not w.wants_plain_read() and w.etag == "e1"
    assert w.on_answer("FALSE", "e1") == (False, False)  # timeout_sec expired, nothing changed
    assert w.on_answer("TRUE", "e2") == (True, True)


def test_watch_without_etag_keeps_reading():
    w = maintenance_watch()
    w.on_answer("NONE", None)
    assert w.wants_plain_read()
    assert w.on_answer("TERMINATE_ON_HOST_MAINTENANCE", None)[0]


def test_backoff_doubles_to_the_cap_and_resets():
    b = Backoff(first=0.1, cap=0.5)
    assert [b.fail() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.ok()
    assert b.fail() == 0.1 and b.failures == 1


STATUS = {"step": 120, "committed_step": 118, "committed_kind": "emergency", "committed_durable": "local",
          "emergency": {"state": "committed", "step": 118, "reason": None}, "total_steps": 1000,
          "updated_at": 1.0, "pid": 42}


def test_heartbeat_from_status_matches_the_schema():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    doc = compose_heartbeat(job_id="j", attempt=3, zone="us-central1-a", state=NodeState.EXITED, status=STATUS,
                            started_at=now, notice="preempted", exit_code=75, now=now)
    assert doc["state"] == NodeState.EXITED and doc["notice"] == "preempted"
    assert (doc["step"], doc["committed_step"], doc["total_steps"]) == (120, 118, 1000)
    assert doc["emergency"] == STATUS["emergency"] and doc["exit_code"] == 75
    assert doc["started_at"] == doc["heartbeat_at"] == now  # datetimes stay datetimes: Firestore timestamps
    assert tuple(doc) == HEARTBEAT_FIELDS
    # The control plane's reading of it (pydantic) takes every value as it is.
    assert Heartbeat.model_validate(doc).model_dump(mode="python") == doc


def test_heartbeat_tolerates_a_missing_or_odd_status():
    doc = compose_heartbeat(job_id="j", attempt=1, zone=None, state=NodeState.STARTING, status=None,
                            started_at=None)
    assert doc["step"] is None and doc["emergency"] is None
    doc = compose_heartbeat(job_id="j", attempt=1, zone=None, state=NodeState.TRAINING,
                            status={"step": "7", "committed_step": True, "emergency": "x"}, started_at=None)
    assert doc["step"] is None and doc["committed_step"] is None and doc["emergency"] is None


def test_read_status_is_tolerant(tmp_path):
    p = tmp_path / "status.json"
    assert read_status(str(p)) is None
    p.write_text('{"step": 1')
    assert read_status(str(p)) is None
    p.write_text("[1, 2]")
    assert read_status(str(p)) is None
    p.write_text(json.dumps(STATUS))
    assert read_status(str(p)) == STATUS


def test_firestore_values():
    t = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc)
    assert encode_value(None) == {"nullValue": None}
    assert encode_value(True) == {"booleanValue": True}
    assert encode_value(12) == {"integerValue": "12"}
    assert encode_value(1.5) == {"doubleValue": 1.5}
    assert encode_value(NodeState.TRAINING) == {"stringValue": "training"}
    assert encode_value(t) == {"timestampValue": "2026-01-02T03:04:05.600000Z"}
    assert encode_value({"a": [1]}) == {"mapValue": {"fields": {"a": {"arrayValue": {"values": [{"integerValue": "1"}]}}}}}
    with pytest.raises(TypeError):
        encode_value(object())


def test_output_tail_keeps_the_last_lines_of_this_run(tmp_path):
    p = tmp_path / "trainer.log"
    p.write_text("old life\n" + "".join(f"line {i}\n" for i in range(100)))
    tail = log_tail(str(p), start=len("old life\n"))
    assert tail.splitlines() == [f"line {i}" for i in range(50, 100)]
    p.write_text("x" * 10 + "\n" + "y" * 9000 + "\n")
    assert len(log_tail(str(p)).encode()) <= 4096
    assert log_tail(str(tmp_path / "missing")) == ""


def test_exit_status_of_a_signalled_process_reads_like_the_shell():
    assert normalize_exit(-9) == 137 and normalize_exit(-15) == 143 and normalize_exit(3) == 3
