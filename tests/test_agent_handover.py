"""A node created during its predecessor's notice (respawn-handover), or a warm spare named by a generation in the
place of a member in its notice (Generation.handover), prepares at once but starts its trainer only once that node
stopped: its final heartbeat says exited, it never beat, or its notice is over. Real agents against the metadata sim
and the Firestore emulator (the heartbeats' database)."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (agent_env: a fixture)
from respawn.contract import ATTR_GENERATION, NODES_COLLECTION, Generation, Handover


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
    wait_for(lambda: _said(agent, "taking over from a node in its notice"), 30, "the agent waiting for ho-1")
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


def test_a_spare_named_in_a_noticed_members_place_waits_for_its_emergency_save(agent_env):
    # A spare: a member (ATTR_GENERATION present, empty) that prepared and waits. The generation that takes it in
    # hs-1's place names hs-1, which still saves: its own member (hs-3, also named) is not waited for.
    _beat(agent_env, "hs-1", "preempting")
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store")
    md = agent_env.metadata("hs-2", {**attributes("hs", 2, agent_env.project, s), ATTR_GENERATION: ""})
    agent = agent_env.agent(md, agent_env.tmp / "hs-2")
    wait_for(lambda: _said(agent, "prepared: waiting for a generation") or _said(agent, "preparation finished"), 30,
             "the spare prepared")
    until = (datetime.now(timezone.utc) + timedelta(seconds=120)).isoformat()
    md.set_attribute(ATTR_GENERATION, Generation(2, ("hs-2",), "127.0.0.1",
                                                 (Handover("hs-1", until), Handover("hs-2", until))).to_json())
    wait_for(lambda: _said(agent, "taking over from a node in its notice"), 30, "the spare waiting for hs-1")
    time.sleep(1.5)
    assert agent.trainer_record() is None  # hs-1 still saves
    _beat(agent_env, "hs-1", "exited")
    wait_for(lambda: agent.trainer_record(), 15, "the spare's trainer started once hs-1 stopped")
    waited = [e["predecessor"] for e in agent.events() if e["message"].startswith("taking over from a node")]
    assert waited == ["hs-1"]
