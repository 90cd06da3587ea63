"""functions/alerts.py: alert JSON composition and its Slack rendering (Block Kit plus a text fallback)."""

from datetime import datetime, timezone

import pytest

from respawn.control import alerts

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)


def test_recovered_alert_says_where_from_where_to_its_recovery_time_and_steps_lost():
    a = alerts.make("recovered", "llama", NOW, "llama-4 is running", old_zone="us-central1-a", new_zone="us-central1-b",
                    recovery_seconds=95.2, steps_lost=12, restarts=3, attempt=4, cause="preempted")
    assert a["severity"] == "info" and a["at"] == "2025-01-01T12:00:00+00:00"
    msg = alerts.to_slack(a)
    # The recovery time as every renderer shows it (recovery_time.text): the figure itself, not a rounding of it.
    assert "us-central1-a → us-central1-b" in msg["text"] and "recovery time: 95.2 s" in msg["text"]
    assert "steps lost: 12" in msg["text"]
    assert msg["blocks"][0]["type"] == "section" and "*llama*" in msg["blocks"][0]["text"]["text"]
    fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in msg["blocks"][2]["fields"]}
    assert fields["*Restarts*"] == "3" and fields["*Recovery time*"] == "95.2 s"


@pytest.mark.parametrize("kind", alerts.TYPES)
def test_every_alert_type_renders_with_a_fallback_text(kind):
    msg = alerts.to_slack(alerts.make(kind, "j", NOW, "something happened", output_tail="Traceback ..."))
    assert msg["text"].startswith("Job j ") and msg["blocks"][-1]["type"] == "context"


def test_unknown_types_are_refused_at_composition_and_rendered_plainly_when_received():
    with pytest.raises(ValueError, match="unknown alert type"):
        alerts.make("exploded", "j", NOW, "")
    assert alerts.to_slack({"type": "future_kind", "job_id": "j"})["text"] == "Job j future_kind"


@pytest.mark.parametrize("bad", [None, [], {"type": "recovered"}, {"job_id": "j"}, {"type": 3, "job_id": "j"}])
def test_non_alerts_are_rejected(bad):
    with pytest.raises(alerts.BadAlert):
        alerts.to_slack(bad)


def test_a_boot_failure_alert_shows_the_node_and_the_end_of_its_console():
    a = alerts.make("boot_failed", "llama", NOW, "no agent heartbeat from llama-4 within 900 s of its boot",
                    node="llama-4", zone="us-central1-b", failures=1, preemptions=2, restarts=3,
                    console_tail="x" * 5000 + "startup-script: could not download gs://b/agent.pyz")
    assert a["severity"] == "warning"
    msg = alerts.to_slack(a)
    assert "had a node that never started its agent" in msg["text"] and "node: llama-4 in us-central1-b" in msg["text"]
    assert "failures: 1; preemptions: 2" in msg["text"]
    console = msg["blocks"][-2]["text"]["text"]
    assert console.startswith("Serial console (end):") and console.endswith("could not download gs://b/agent.pyz```")
    assert len(console) < 3000  # Slack's section text limit is 3000 characters


def test_a_preemption_rate_alert_names_the_limit_and_the_action():
    a = alerts.make("preemption_rate", "llama", NOW, "7 preemptions within 24 h (more than 6); waiting 60 s",
                    max=6, window_hours=24, action="backoff", failures=0, preemptions=40)
    msg = alerts.to_slack(a)
    assert "limit: 6 in 24 h; action: backoff" in msg["text"] and "preemptions: 40" in msg["text"]


def test_the_recovered_alert_counts_failures_and_preemptions_apart_when_it_has_them():
    a = alerts.make("recovered", "llama", NOW, "llama-4 in us-central1-b is running and its agent reports",
                    restarts=3, failures=1, preemptions=2)
    assert "restarts: 3; failures: 1; preemptions: 2" in alerts.to_slack(a)["text"]
    old = alerts.make("recovered", "llama", NOW, "from an older controller", restarts=3)
    assert "failures" not in alerts.to_slack(old)["text"]
