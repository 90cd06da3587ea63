"""A node created during its predecessor's notice (respawn-handover) prepares at once but starts its trainer only once
that node stopped: its final heartbeat says exited, it never beat, or its notice is over. Real agents against the
metadata sim and the Firestore emulator (the heartbeats' database)."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (agent_env: a fixture)
from respawn.contract import NODES_COLLECTION, Handover


def _boot(env, node: str, predecessor: str, until: datetime):
    job, _, attempt = node.rpartition("-")
    s = settings([sys.executable, str(env.tiny_trainer)], f"file://{env.tmp}/store")
    attrs = {**attributes(job, int(attempt), env.project, s),
             "respawn-handover": Handover(predecessor, until.isoformat()).to_json()}
    return env.agent(env.metadata(node, attrs), env.tmp / node)


def _beat(env, node: str, state: str) -> None:
    env.nodes_db.collection(NODES_COLLECTION).document(node).set({"state": state, "attempt": 1})


def _said(agent, prefix: str) -> dict | None:
    return next((e for e in agent.events() if e["message"].startswith(prefix)), None)


def test_the_trainer_waits_for_the_predecessor_to_stop(agent_env):
    _beat(agent_env, "ho-1", "preempting")
    agent = _boot(agent_env, "ho-2", "ho-1", datetime.now(timezone.utc) + timedelta(seconds=120))
    wait_for(lambda: _said(agent, "created during the notice"), 30, "the agent waiting for ho-1")
    assert _said(agent, "preparation finished") is not None  # preparation does not wait
    time.sleep(1.5)
    assert agent.trainer_record() is None  # ho-1 still saves
    _beat(agent_env, "ho-1", "exited")
    wait_for(lambda: agent.trainer_record(), 15, "the trainer started once ho-1 stopped")
    said = _said(agent, "handover: the predecessor stopped")
    assert said["predecessor_state"] == "exited" and said["waited_s"] >= 1.5


def test_a_predecessor_still_saving_at_the_end_of_its_notice_or_never_beating_holds_nothing_up(agent_env):
    _beat(agent_env, "hu-1", "preempting")
    agent = _boot(agent_env, "hu-2", "hu-1", datetime.now(timezone.utc) + timedelta(seconds=2))
    wait_for(lambda: agent.trainer_record(), 30, "the trainer started once hu-1's notice was over")
    assert _said(agent, "handover: the predecessor's notice is over") is not None
    agent = _boot(agent_env, "hn-2", "hn-1", datetime.now(timezone.utc) + timedelta(seconds=120))
    wait_for(lambda: agent.trainer_record(), 30, "the trainer started: hn-1 never beat")
    assert _said(agent, "handover: the predecessor stopped")["predecessor_state"] is None
