"""The agent stays small: an idle agent (default 15 s heartbeat, 60 s metadata waits, a trainer that sleeps)
measured with respawn.agent.measure. Run with -s to see the figures recorded in node_agent/README.md. Memory is
asserted (the 60 MB goal: e.g. importing google-cloud-firestore alone would break it); CPU is only reported."""

from __future__ import annotations

import json

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (fixture)
from respawn.agent.measure import measure

RSS_GOAL_MB = 60


def test_idle_agent_footprint(agent_env):
    s = settings(["sleep", "600"], f"file://{agent_env.tmp}/store", heartbeat_seconds=15, metadata_wait_seconds=60)
    md = agent_env.metadata("idle-1", attributes("idle", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "idle-1")
    wait_for(lambda: (agent_env.heartbeat("idle-1") or {}).get("state") == "training", 60, "training heartbeat")
    figures = measure(agent.proc.pid, seconds=10)
    print("\nidle agent:", json.dumps(figures))
    assert figures["rss_mb"] < RSS_GOAL_MB, figures
    assert figures["peak_rss_mb"] < RSS_GOAL_MB, figures
    assert agent.proc.poll() is None  # still running: measuring did not disturb it
