"""Failures and preemptions counted apart, through the entry points (issue #22 item 2): a job whose agent never
starts ends FAILED after exactly two boots with its serial console's tail; a job preempted 30 times with
max_failures 3 still succeeds. The sim's nodes boot a command that prints an error to their console and exits, as a
broken image's startup script does; heartbeats are written by the test as the agent would."""

from __future__ import annotations

import sys
import time

import pytest

from functions_fixtures import ZONES, controller, gpu_spec  # noqa: F401
from sim_fixtures import sim_factory  # noqa: F401

BROKEN_BOOT = ('echo \'{"severity": "ERROR", "message": "respawn-startup: no python3 on this image; starting no '
               'agent"}\'; exit 1')


@pytest.fixture
def sim_server(sim_factory):
    # Every node's guest prints the startup script's error and exits (the VM stays RUNNING, as on Google Cloud).
    return sim_factory(boot_command=["sh", "-c", BROKEN_BOOT], notice_seconds=0.1)


def _spec(job_id: str, **over):
    """gpu_spec with max_failures 3 in place of the fixtures' max_restarts (its old name: both may not be given)."""
    spec = gpu_spec(job_id, **over)
    spec.pop("max_restarts", None)
    return {**spec, "max_failures": 3}


def _sweep_until(controller, job: str, states: set[str], timeout: float = 60):
    """Sweep the job (as the scheduled sweep would, every 0.2 s here) until it is in one of `states`."""
    deadline = time.monotonic() + timeout
    while True:
        assert controller.sweep(job) == 200
        st = controller.status(job)
        if st.state.value in states:
            return st
        assert time.monotonic() < deadline, f"job {job} is {st.state.value} ({st.message}), not {states}"
        time.sleep(0.2)


def test_a_job_whose_agent_never_starts_fails_after_two_boots_with_the_console_tail(controller, monkeypatch):
    monkeypatch.setenv("RESPAWN_BOOT_GRACE_SECONDS", "1")
    job = controller.register(_spec("noagent"))
    assert controller.job_created(job) == 200
    controller.wait_state(job, "RUNNING")
    st = _sweep_until(controller, job, {"FAILED"})
    booted = [r for r in controller.sim.history() if r["labels"].get("respawn-job") == job]
    assert [r["name"] for r in booted] == ["noagent-1", "noagent-2"]  # exactly two boots, then nothing more
    assert controller.live(job) == [] and controller.sim.max_live(job) == 1
    assert (st.failures, st.preemptions, st.members[0].boot_failures, st.last_cause) == (2, 0, 2, "no_heartbeat")
    assert "no python3 on this image" in st.members[0].console_tail
    for what in ("boot image", "startup script", "respawn-agent", "noagent-2"):
        assert what in st.message, what
    alerts = controller.alerts(want=2)
    assert [a["type"] for a in alerts] == ["boot_failed", "failed"]  # never "recovered"
    assert all("no python3 on this image" in a["console_tail"] for a in alerts)
    causes = [(e["to_state"], e["cause"]) for e in controller.events(job)]
    # A boot failure is the job's own: RESTARTING, never PREEMPTED.
    assert causes.count(("RESTARTING", "no_heartbeat")) == 1 and causes[-1] == ("FAILED", "no_heartbeat")
    assert not [c for c in causes if c[0] == "PREEMPTED"]


def test_a_job_preempted_8_times_with_max_failures_3_still_succeeds(controller):
    # More preemptions than twice max_failures: none of them counts as a failure.
    times = 8
    job = controller.register(_spec("spotty", termination_action="DELETE"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    for n in range(times):
        controller.heartbeat(st.node, step=10 * n + 5, committed_step=10 * n)  # its agent runs: the recovery
        assert controller.sweep(job) == 200
        controller.sim.preempt(st.zone, st.node)
        assert controller.log_event(controller.wait_system_event(st.node)) == 200
        after = controller.wait_state(job, "RUNNING")
        assert after.attempt == st.attempt + 1, (n, after)
        st = after
    controller.heartbeat(st.node, state="exited", exit_code=0, step=10 * times, committed_step=10 * times)
    assert controller.sweep(job) == 200
    done = controller.wait_state(job, "SUCCEEDED")
    assert (done.preemptions, done.failures, done.restarts, done.attempt) == (times, 0, times, times + 1)
    assert controller.sim.max_live(job) == 1 and controller.live(job) == []
    kinds = [a["type"] for a in controller.alerts(want=times + 1, timeout=20)]
    # One recovered per preemption, each once the replacement's agent reported; the last recovery's node never
    # reported before it exited 0, so one fewer; then the end.
    assert kinds.count("recovered") == times - 1 and kinds[-1] == "succeeded" and "failed" not in kinds


TRACEBACK = ('Traceback (most recent call last):\n  File "/srv/train.py", line 12, in <module>\n'
             '    raise ValueError("bad learning rate")\nValueError: bad learning rate\n')


def test_a_trainer_that_crashes_at_every_start_is_a_failure_in_every_word(controller, monkeypatch):
    """Issue 46: a trainer raising ValueError at once, max_failures 1. The events say RESTARTING, then FAILED, with
    the crash's cause and never a preemption; the message's count is the counter's; the trainer's last error is on
    the record, each event and each alert, and Slack shows it on a line of its own."""
    from sim.slack import SlackReceiver

    monkeypatch.setenv("RESPAWN_BACKOFF_BASE_SECONDS", "0.1")
    job = controller.register({**_spec("crashy", termination_action="DELETE"), "max_failures": 1})
    assert controller.job_created(job) == 200
    first = controller.wait_state(job, "RUNNING")
    controller.heartbeat(first.node, state="exited", exit_code=1, step=0, committed_step=None, output_tail=TRACEBACK)
    deadline = time.monotonic() + 60
    while (st := controller.status(job)).state.value != "RUNNING" or st.node == first.node:  # its replacement
        assert controller.sweep(job) == 200 and time.monotonic() < deadline, st.message
        time.sleep(0.2)
    controller.heartbeat(st.node, state="exited", exit_code=1, step=0, committed_step=None, output_tail=TRACEBACK)
    st = _sweep_until(controller, job, {"FAILED"})  # the second crash is past max_failures
    assert (st.failures, st.preemptions, st.last_cause) == (2, 0, "trainer_crashed")
    assert st.message.startswith("gave up after 2 failures, more than max_failures (1)"), st.message
    assert st.last_error == "ValueError: bad learning rate" and "ValueError: bad learning rate" in st.message
    events = controller.events(job)
    crashes = [e for e in events if e["cause"] == "trainer_crashed"]
    assert [(e["from_state"], e["to_state"]) for e in crashes] == [("RUNNING", "RESTARTING"), ("RUNNING", "FAILED")]
    assert all(e["details"]["last_error"] == "ValueError: bad learning rate" for e in crashes)
    assert "PREEMPTED" not in [e["to_state"] for e in events] and st.preemptions == 0
    sent = controller.alerts(want=2)
    assert [(a["type"], a["failures"]) for a in sent] == [("crashed", 1), ("failed", 2)]
    assert [a["last_error"] for a in sent] == ["ValueError: bad learning rate"] * 2
    with SlackReceiver() as slack:
        monkeypatch.setenv("SLACK_WEBHOOK_URL", slack.url)
        assert controller.alert(sent[-1]) == 200
        [payload] = slack.wait_for(1)
    lines = [b["text"]["text"] for b in payload["blocks"] if b["type"] == "section" and "text" in b]
    assert "last error: ValueError: bad learning rate" in lines and "failures: 2" in payload["text"]


def test_a_failed_setup_ends_the_job_failed_at_once_naming_the_command_and_no_node_is_made_again(controller,
                                                                                                 monkeypatch):
    """The agent's setup-failed heartbeat (tests/test_agent_prepare.py writes it from a real agent) through the entry
    points (what the setup-fails demo scenario showed, moved down from tests/test_demo_scenarios.py): not a
    preemption and not retried, whatever max_failures allows; FAILED at the first failure, the command and its
    output named in the status, the event and Slack; the node deleted and none made again."""
    from respawn.control import alerts
    from sim.slack import SlackReceiver

    command = [sys.executable, "-m", "pip", "install", "--no-index", "--quiet", "torch==9.9"]
    tail = "ERROR: Could not find a version that satisfies the requirement torch==9.9 (from versions: none)\n" \
           "ERROR: No matching distribution found for torch==9.9"
    job = controller.register(_spec("setupbad", termination_action="DELETE"))  # max_failures 3
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    controller.heartbeat(st.node, state="setup-failed", step=None, committed_step=None, exit_code=1,
                         failed_command=command, output_tail=tail)
    st = _sweep_until(controller, job, {"FAILED"})
    assert (st.restarts, st.failures, st.preemptions, st.last_cause) == (0, 1, 0, "setup_failed")
    said = " ".join(command[1:])
    assert said in st.message and "torch==9.9" in st.message, st.message
    events = controller.events(job)
    assert [e["to_state"] for e in events] == ["PROVISIONING", "RUNNING", "FAILED"], events
    details = events[-1]["details"]
    assert events[-1]["cause"] == "setup_failed" and details["failed_command"] == command
    assert details["exit_code"] == 1 and "torch==9.9" in details["output_tail"]
    controller.sim.wait_for(lambda: controller.live(job) == [], 30, "the node deleted")
    assert [r["name"] for r in controller.sim.history() if r["labels"].get("respawn-job") == job] == [st.node]
    assert controller.sweep(job) == 200 and controller.status(job).state.value == "FAILED"  # it stays so
    assert [r["name"] for r in controller.sim.history() if r["labels"].get("respawn-job") == job] == [st.node]
    [failed] = [a for a in controller.alerts(want=1) if a["type"] == "failed"]
    with SlackReceiver() as slack:
        monkeypatch.setenv("SLACK_WEBHOOK_URL", slack.url)
        assert controller.alert(failed) == 200
        [payload] = slack.wait_for(1)
    assert payload["text"].startswith(f"Job {job} failed") and said in payload["text"], payload["text"]
    assert alerts.to_slack(failed)["text"] == payload["text"]
