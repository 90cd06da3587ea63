"""on_alert: alert JSON from Pub/Sub → Slack Block Kit with a text fallback; 429/5xx retried, 4xx dropped; and a
failing alert path never holds up recovery."""

from __future__ import annotations

import functions_framework
import pytest

from functions_fixtures import SOURCE, controller, gpu_spec, pubsub_event  # noqa: F401
from sim.slack import SlackReceiver
from sim_fixtures import sim_factory, sim_server  # noqa: F401

ALERT = {"type": "recovered", "severity": "info", "job_id": "llama", "at": "2025-01-01T12:00:00+00:00",
         "message": "llama-4 is running in us-central1-b", "old_zone": "us-central1-a", "new_zone": "us-central1-b",
         "recovery_seconds": 95.2, "steps_lost": 12, "restarts": 3, "attempt": 4, "cause": "preempted"}


@pytest.fixture
def slack(monkeypatch):
    with SlackReceiver() as receiver:
        monkeypatch.setenv("SLACK_WEBHOOK_URL", receiver.url)
        monkeypatch.setenv("RESPAWN_SLACK_BACKOFF_SECONDS", "0.01")
        monkeypatch.setenv("RESPAWN_SLACK_ATTEMPTS", "4")
        yield receiver


@pytest.fixture
def on_alert():
    app = functions_framework.create_app(target="on_alert", source=SOURCE, signature_type="cloudevent")

    def deliver(body):
        return app.test_client().post("/", headers=pubsub_event(body)[0], data=pubsub_event(body)[1]).status_code

    return deliver


def test_alert_is_posted_as_block_kit_with_a_text_fallback(slack, on_alert):
    assert on_alert(ALERT) == 200
    [payload] = slack.wait_for(1)
    assert "us-central1-a → us-central1-b" in payload["text"] and "steps lost: 12" in payload["text"]
    assert payload["blocks"][0]["type"] == "section" and "*llama*" in payload["blocks"][0]["text"]["text"]


@pytest.mark.parametrize("status", [429, 500, 503])
def test_rate_limits_and_server_errors_are_retried(slack, on_alert, status):
    slack.fail(status, count=2, retry_after=0)
    assert on_alert(ALERT) == 200
    assert [r["status"] for r in slack.requests] == [status, status, 200]


@pytest.mark.parametrize("status", [400, 403, 404, 410])
def test_client_errors_are_dropped_after_one_try(slack, on_alert, status, capsys):
    slack.fail(status, count=-1)
    assert on_alert(ALERT) == 200
    assert [r["status"] for r in slack.requests] == [status]
    assert f"HTTP {status}" in capsys.readouterr().out


def test_slack_down_for_good_raises_so_the_platform_redelivers(slack, on_alert):
    slack.fail(500, count=-1)
    assert on_alert(ALERT) == 500
    assert len(slack.requests) == 4


def test_non_alert_messages_are_acknowledged_without_posting(slack, on_alert):
    assert on_alert({"hello": "world"}) == 200
    assert on_alert([1, 2]) == 200
    assert slack.requests == []


def test_published_alert_reaches_slack_through_on_alert(controller, slack):
    job = controller.register(gpu_spec("notify", zones=["us-central1-a"]))
    controller.sim.set_capacity("us-central1-a", "nvidia-tesla-t4", 0)
    assert controller.job_created(job) == 200
    controller.wait_state(job, "WAITING_FOR_CAPACITY")
    [alert] = controller.alerts(want=1)
    assert alert["type"] == "waiting_for_capacity" and alert["zones"] == ["us-central1-a"]
    assert controller.alert(alert) == 200
    [payload] = slack.wait_for(1)
    assert "waiting for capacity" in payload["text"]


def test_a_broken_alert_path_never_holds_up_recovery(controller, monkeypatch):
    monkeypatch.setenv("RESPAWN_ALERTS_TOPIC", "no-such-topic")  # publishing fails (NOT_FOUND)
    job = controller.register(gpu_spec("quiet", termination_action="DELETE"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    assert controller.wait_state(job, "RUNNING").attempt == 2


def test_a_boot_failure_reaches_slack_with_the_console_tail(slack, on_alert):
    alert = {"type": "boot_failed", "severity": "warning", "job_id": "llama", "at": "2025-01-01T12:00:00+00:00",
             "message": "no agent heartbeat from llama-4 within 900 s of its boot; replacing it", "node": "llama-4",
             "zone": "us-central1-b", "failures": 1, "preemptions": 0, "restarts": 1, "attempt": 4,
             "cause": "no_heartbeat", "console_tail": "respawn-startup: python3 not found on the image"}
    assert on_alert(alert) == 200
    [payload] = slack.wait_for(1)
    assert "Job llama had a node that never started its agent; replacing it" in payload["text"]
    assert any("python3 not found on the image" in b.get("text", {}).get("text", "") for b in payload["blocks"])
