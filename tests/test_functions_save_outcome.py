"""A failed emergency save is never silent (issue 45 item 3) through the entry points: a node replaced during its
notice is still saving when its loss is recorded; its final heartbeat (written here as its agent writes it) says the
save failed on rank 1, the next reconcile puts that on the job's record and tells it in an event and an alert of its
own (`save_outcome`: the loss's event was written before), and the recovery's event, alert and Slack message say it
in words, once. The VMs ask for a 120 s notice, so the noticed VM runs on through the test."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from functions_fixtures import controller, gpu_spec  # noqa: F401
from respawn import losswords
from respawn.control import alerts
from sim.slack import SlackReceiver
from sim_fixtures import sim_factory  # noqa: F401

FAILED_SAVE = {"state": "failed", "step": None,
               "reason": "rank 1: RuntimeError: DataLoader worker (pid 7883) is killed by signal: Terminated."}
SAID = ("emergency save failed on rank 1: RuntimeError: DataLoader worker (pid 7883) is killed by signal: Terminated "
        "— resumed from step 96, 4 steps lost")


@pytest.fixture
def sim_server(sim_factory):
    return sim_factory(audit_timing="start")


def test_a_save_that_failed_during_the_notice_reaches_the_record_the_recovery_and_slack(controller, monkeypatch):
    job = controller.register(gpu_spec("saver", termination_action="DELETE", notice_seconds=120))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    old = st.node
    controller.heartbeat(old, step=100, committed_step=96)
    controller.sim.preempt(st.zone, old)
    controller.heartbeat(old, state="preempting", notice="preempted", step=100, committed_step=96,
                         emergency={"state": "saving", "step": 100, "reason": None})
    assert controller.notice(job, old) == 200
    noticed = controller.status(job)
    assert noticed.members[0].leaving.node == old and noticed.emergency is None  # still saving: nothing said yet
    [loss] = [e for e in controller.events(job) if e.get("details", {}).get("during_notice")]
    assert loss["cause"] == "preempted" and "emergency" not in loss["details"]

    # The noticed node's final heartbeat: its save failed on rank 1. The job's next reconcile records it.
    controller.heartbeat(old, state="exited", exit_code=1, notice="preempted", step=100, committed_step=96,
                         emergency=FAILED_SAVE)
    assert controller.sweep(job) == 200
    told = controller.status(job)
    assert told.emergency == told.members[0].emergency == FAILED_SAVE
    # Told late, it is told once, in words: one event (`jobs events`' says column, the live view) and one alert.
    [late] = [e for e in controller.events(job) if e["details"].get("emergency") == FAILED_SAVE]
    assert (late["cause"], late["details"]["node"]) == ("save_outcome", old)
    assert losswords.event_words(late["details"]) == ("emergency save failed on rank 1: RuntimeError: DataLoader "
                                                      "worker (pid 7883) is killed by signal: Terminated (told after "
                                                      "its loss was recorded)")
    [heard] = controller.alerts(want=1)
    assert (heard["type"], heard["node"], heard["emergency"]) == ("save_outcome", old, FAILED_SAVE)
    assert alerts.to_slack(heard)["text"].count("emergency save failed on rank 1: RuntimeError") == 1

    # The replacement resumes from step 96 and steps: the recovery tells the save's outcome.
    new = controller.wait_state(job, "RUNNING").node
    assert new != old
    controller.heartbeat(new, step=98, committed_step=96, first_step=97, started_at=datetime.now(timezone.utc))
    assert controller.sweep(job) == 200
    [recovered] = [e for e in controller.events(job) if e["cause"] == "recovered"]
    assert recovered["details"]["emergency"] == FAILED_SAVE
    assert (recovered["details"]["resumed_from"], recovered["details"]["steps_lost"]) == (96, 4)
    [alert] = [a for a in controller.alerts(want=1) if a["type"] == "recovered"]
    assert alert["emergency"] == FAILED_SAVE
    with SlackReceiver() as slack:
        monkeypatch.setenv("SLACK_WEBHOOK_URL", slack.url)
        assert controller.alert(alert) == 200
        [payload] = slack.wait_for(1)
    lines = [b["text"]["text"] for b in payload["blocks"] if b["type"] == "section" and "text" in b]
    assert SAID in lines and sum("emergency save" in line for line in lines) == 1
    assert payload["text"].count("emergency save failed on rank 1") == 1
