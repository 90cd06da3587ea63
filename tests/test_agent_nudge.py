"""The agent wakes the controller when its node fails on its own: real agents against the metadata sim, the Firestore
emulator and the Pub/Sub emulator (its sweep topic read through a pull subscription, as on_sweep's would be fed).

A trainer's error exit, its end or its first step, a failed setup → exactly one {"task": "sweep", "job_id": JOB} on
the sweep topic, after the heartbeat that reports it; a trainer that stops on a notice (exit 75) → nothing; a topic
the node may not publish to → one WARNING naming the topic and the grant to check, and the node carries on."""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (agent_env: a fixture)
from respawn.contract import EXIT_PREEMPTED, Generation


@pytest.fixture
def sweep(pubsub_emulator, project):
    """A fresh sweep topic on the emulator and a pull subscription on it: (topic id, pull())."""
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = f"sweep-{uuid.uuid4().hex[:8]}"
    publisher.create_topic(name=publisher.topic_path(project, topic))
    sub = subscriber.subscription_path(project, f"{topic}-sub")
    subscriber.create_subscription(name=sub, topic=publisher.topic_path(project, topic))

    def pull() -> list[dict]:
        """Every message on the topic so far (the emulator has them once publish has answered), acknowledged."""
        got = []
        while True:
            resp = subscriber.pull(subscription=sub, max_messages=10, return_immediately=True, timeout=10)
            if not resp.received_messages:
                return got
            subscriber.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in resp.received_messages])
            got.extend(json.loads(m.message.data) for m in resp.received_messages)

    yield topic, pull
    subscriber.delete_subscription(subscription=sub)
    publisher.delete_topic(topic=publisher.topic_path(project, topic))


def _tiny(env, *flags: str) -> list[str]:
    return [sys.executable, str(env.tiny_trainer), *flags]


def _boot(env, job: str, attempt: int, s: dict, member: bool = False):
    """A node of `job` booted with settings `s`: its metadata server and its agent (a multi-node member waits for a
    generation)."""
    node = f"{job}-{attempt}"
    attrs = attributes(job, attempt, env.project, s)
    md = env.metadata(node, {**attrs, "respawn-generation": ""} if member else attrs)
    return md, env.agent(md, env.tmp / node)


def _stepping(agent) -> bool:
    """The trainer wrote a step: its SIGTERM handler is in place."""
    return (agent.node_dir / "status.json").exists()


def _woken(agent) -> list[dict]:
    return [e for e in agent.events() if e["message"] == "controller woken: sweep requested for this job"]


def test_a_members_trainer_error_wakes_the_controller_once(agent_env, sweep):
    topic, pull = sweep
    s = settings(_tiny(agent_env, "--crash-at", "20"), f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 heartbeat_seconds=30)  # the report must not wait for a periodic beat: the exit's own lands first
    md, agent = _boot(agent_env, "nj", 2, s, member=True)
    wait_for(lambda: (agent_env.heartbeat("nj-2") or {}).get("state") == "waiting", 60, "the member waiting")
    # Prepared: the controller may form a generation with it now, not at its next sweep; once.
    assert wait_for(pull, 10, "the prepared member's wake-up") == [{"task": "sweep", "job_id": "nj"}]
    md.set_attribute("respawn-generation", Generation(1, ("nj-1", "nj-2"), "127.0.0.1").to_json())
    wait_for(lambda: len(_woken(agent)) == 2, 60, "the controller woken by the crash")
    # The heartbeat that says so had landed before the message went: the controller reads the exit when it wakes.
    hb = agent_env.heartbeat("nj-2")
    assert (hb["state"], hb["exit_code"], hb["generation"]) == ("waiting", 3, 1)
    assert "loss is NaN at step 20" in hb["output_tail"]
    assert pull() == [{"task": "sweep", "job_id": "nj"}]
    assert [w["why"] for w in _woken(agent)] == ["prepared: waiting for a generation", "trainer exited 3"]
    assert _woken(agent)[1]["topic"] == f"projects/{agent_env.project}/topics/{topic}"
    # The member waits for the next generation (the controller's to write) and sends nothing more meanwhile.
    time.sleep(1.0)
    assert pull() == [] and len(_woken(agent)) == 2 and agent.proc.poll() is None


def test_a_notice_is_told_at_once_and_the_trainer_stopping_on_it_sends_nothing_more(agent_env, sweep):
    topic, pull = sweep
    # Beats 30 s apart: the message must not wait for one. The trainer ignores the notice, so the node is still
    # saving (the agent waiting out its budget) when the message is read.
    s = settings(_tiny(agent_env, "--ignore-notice"), f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 heartbeat_seconds=30, notice_budget_seconds=6)
    md, agent = _boot(agent_env, "nq", 2, s, member=True)
    wait_for(lambda: (agent_env.heartbeat("nq-2") or {}).get("state") == "waiting", 60, "the member waiting")
    assert wait_for(pull, 10, "the prepared member's wake-up") == [{"task": "sweep", "job_id": "nq"}]
    md.set_attribute("respawn-generation", Generation(1, ("nq-1", "nq-2"), "127.0.0.1").to_json())
    wait_for(lambda: _stepping(agent), 60, "the trainer stepping")
    before = datetime.now(timezone.utc)
    md.set("instance/preempted", "TRUE")
    [message] = wait_for(pull, 5, "the notice on the sweep topic")
    assert agent.proc.poll() is None  # told while the node still saves
    notice = message.pop("notice")
    assert message == {"task": "sweep", "job_id": "nq"}
    assert (notice["node"], notice["kind"]) == ("nq-2", "preempted")
    assert before - timedelta(seconds=1) <= datetime.fromisoformat(notice["at"]) <= datetime.now(timezone.utc)
    assert agent.wait(60) == 0  # the agent is gone: anything it would have sent is on the topic by now
    hb = agent_env.heartbeat("nq-2")
    assert (hb["state"], hb["notice"]) == ("exited", "preempted")
    assert pull() == [] and [w["why"] for w in _woken(agent)] == ["prepared: waiting for a generation",
                                                                  "preempted notice"]


def test_a_sigterm_alone_tells_nothing_and_a_sigterm_after_the_notice_is_the_soft_off(agent_env, sweep):
    topic, pull = sweep
    # A user's stop (SIGTERM alone) is no preemption: nothing is published. Beats 30 s apart: none sees the trainer
    # stepping, whose first step would wake the controller (test_the_trainers_first_step_…).
    s = settings(_tiny(agent_env), f"file://{agent_env.tmp}/store", sweep_topic=topic, heartbeat_seconds=30)
    _, agent = _boot(agent_env, "st", 1, s)
    wait_for(lambda: _stepping(agent), 60, "the trainer stepping")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 0 and pull() == []
    # A 25 s notice (notice_seconds) in a 30 s budget: the soft-off 1 s after the notice leaves the save 5 s, not 29.
    s = settings(_tiny(agent_env, "--ignore-notice"), f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 notice_budget_seconds=30, notice_seconds=25, heartbeat_seconds=30)
    md, agent = _boot(agent_env, "so", 1, s)
    wait_for(lambda: _stepping(agent), 60, "the trainer stepping")
    md.set("instance/preempted", "TRUE")
    wait_for(lambda: any(e["message"].startswith("notice: telling") for e in agent.events()), 10, "the notice")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(20) == 0  # the deadline moved: with the notice's own it would still be waiting
    [soft_off] = [e for e in agent.events() if e["message"].startswith("soft-off")]
    assert soft_off["severity"] == "WARNING" and soft_off["seconds_left"] <= 5
    assert any(e["message"].startswith("the trainer did not exit within") for e in agent.events())
    assert [m["notice"]["node"] for m in pull()] == ["so-1"]


def test_a_single_nodes_trainer_error_a_failed_setup_and_the_end_each_wake_it(agent_env, sweep):
    topic, pull = sweep
    # A single node's trainer fails: the agent exits after its report, and the message is out before it does.
    # Beats 30 s apart, for both short trainers: no beat sees one stepping (its first step wakes the controller too).
    s = settings(_tiny(agent_env, "--crash-at", "5"), f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 heartbeat_seconds=30)
    _, agent = _boot(agent_env, "one", 1, s)
    assert agent.wait(60) == 0
    assert agent_env.heartbeat("one-1")["exit_code"] == 3
    assert pull() == [{"task": "sweep", "job_id": "one"}]
    # A failed setup: the node stays up heartbeating setup-failed, and says so once.
    s = settings(_tiny(agent_env), f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 setup=[["python", "-c", "import sys; sys.exit(4)"]], interpreter=sys.executable)
    _, agent = _boot(agent_env, "bad", 1, s)
    wait_for(lambda: _woken(agent), 60, "the controller woken")
    assert agent_env.heartbeat("bad-1")["state"] == "setup-failed"
    assert pull() == [{"task": "sweep", "job_id": "bad"}]
    # A trainer that finished: its nodes should go now, not at the next sweep.
    s = settings(_tiny(agent_env, "--steps", "10"), f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 heartbeat_seconds=30)
    _, agent = _boot(agent_env, "done", 1, s)
    assert agent.wait(60) == 0
    assert agent_env.heartbeat("done-1")["exit_code"] == 0
    assert pull() == [{"task": "sweep", "job_id": "done"}]


def _beats(agent_env, node: str, n: int) -> None:
    """Wait for `n` more heartbeats of `node` (what a sleep of n beat periods stood for): the agent has looked
    again that many times."""
    seen = {agent_env.heartbeat(node)["heartbeat_at"]}
    wait_for(lambda: seen.add(agent_env.heartbeat(node)["heartbeat_at"]) or len(seen) > n, 30, f"{n} more beats of {node}")


def test_the_trainers_first_step_wakes_the_controller_once(agent_env, sweep):
    # A recovery ends at the replacement's first step: the controller hears it now, not at its next sweep, and only
    # once however many beats see the trainer stepping after it.
    topic, pull = sweep
    s = settings(_tiny(agent_env), f"file://{agent_env.tmp}/store", sweep_topic=topic)  # beats 0.5 s apart
    _, agent = _boot(agent_env, "fs", 2, s)
    [woken] = wait_for(lambda: _woken(agent), 60, "the controller woken by the first step")
    assert woken["why"] == "the trainer's first step"
    hb = agent_env.heartbeat("fs-2")
    assert hb["state"] == "training" and isinstance(hb["first_step"], int) and hb["first_step_at"]
    assert wait_for(pull, 10, "the first step's wake-up") == [{"task": "sweep", "job_id": "fs"}]
    _beats(agent_env, "fs-2", 4)  # four beats more, each seeing the trainer stepping
    assert pull() == [] and len(_woken(agent)) == 1 and agent.proc.poll() is None


def test_a_topic_the_node_cannot_publish_to_is_named_and_the_node_carries_on(agent_env, sweep):
    s = settings(_tiny(agent_env, "--crash-at", "5"), f"file://{agent_env.tmp}/store", sweep_topic="no-such-topic")
    _, agent = _boot(agent_env, "lost", 1, s)
    assert agent.wait(60) == 0  # the heartbeat, not the message, is the report
    assert agent_env.heartbeat("lost-1")["exit_code"] == 3
    # One for the exit, and one for the first step when a beat saw the trainer stepping (a loaded machine's timing).
    warnings = [e for e in agent.events() if e["message"].startswith("could not wake the controller")]
    assert 1 <= len(warnings) <= 2, warnings
    for warning in warnings:
        assert warning["severity"] == "WARNING" and warning["topic"] == \
            f"projects/{agent_env.project}/topics/no-such-topic"
        assert "pubsub.topics.publish" in warning["message"] and "404" in warning["error"]
