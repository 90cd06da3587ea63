"""The demo's measurements, computed from recorded heartbeats and node lifetimes."""

from __future__ import annotations

import pytest

from sim.demo.scenario import ScenarioError, default_scenario, parse_scenario
from sim.demo.summary import HeartbeatSample as S
from sim.demo.summary import Lifetime, RunRecord, lives, lost_steps, max_live, summarize, zones_in_order
from sim.demo.timeline import Mark, NodeSpan, Timeline, render_html


def run(samples, lifetimes, wall=100.0):
    return RunRecord(job_id="j", total_steps=300, wall_seconds=wall, state="SUCCEEDED", restarts=1,
                     samples=samples, lifetimes=lifetimes, alerts=["recovered"])


def test_emergency_checkpoint_at_the_last_step_loses_nothing():
    samples = [S(1, "j-1", "a", "training", 10, 0, 0), S(20, "j-1", "a", "preempting", 120, 120),
               S(30, "j-2", "b", "training", 121, 120, 120), S(60, "j-2", "b", "exited", 300, 300)]
    assert lost_steps(lives(samples)) == 0


def test_steps_beyond_the_resumed_checkpoint_are_lost():
    samples = [S(1, "j-1", "a", "training", 10, 0, 0), S(20, "j-1", "a", "training", 130, 100),
               S(30, "j-2", "b", "training", 101, 100, 100), S(60, "j-2", "b", "exited", 300, 300)]
    assert lost_steps(lives(samples)) == 30


def test_without_resumed_from_the_last_commit_is_assumed():
    samples = [S(1, "j-1", "a", "training", 10, None), S(20, "j-1", "a", "training", 130, 100),
               S(30, "j-2", "b", "training", 110, 100), S(60, "j-2", "b", "exited", 300, 300)]
    assert lost_steps(lives(samples)) == 30


def test_two_lives_on_one_node_are_told_apart():
    samples = [S(1, "j-1", "first", "training", 10, 0, 0), S(20, "j-1", "first", "exited", 50, 50),
               S(30, "j-1", "second", "training", 51, 50, 50), S(60, "j-1", "second", "exited", 300, 300)]
    assert [life.life for life in lives(samples)] == ["first", "second"]


def test_max_live_nodes_counts_overlap_only():
    back_to_back = [Lifetime("j-1", "a", 0, 10), Lifetime("j-2", "b", 10, None)]
    assert max_live(back_to_back, 50) == 1
    overlapping = [Lifetime("j-1", "a", 0, 10), Lifetime("j-2", "b", 9, None)]
    assert max_live(overlapping, 50) == 2


def test_a_dead_nodes_unchanging_heartbeat_does_not_stretch_its_life():
    samples = [S(0, "j-1", "a", "training", 0, None, 0), S(10, "j-1", "a", "exited", 100, 100),
               S(50, "j-1", "a", "exited", 100, 100), S(90, "j-1", "a", "exited", 100, 100)]
    (life,) = lives(samples)
    assert (life.first_t, life.last_t) == (0, 10)


def test_zones_in_order_of_use():
    spans = [Lifetime("j-1", "us-a", 0, 10), Lifetime("j-1", "us-a", 12, 13), Lifetime("j-2", "us-b", 14, 30),
             Lifetime("j-2", "us-b", 35, 40), Lifetime("j-3", "us-a", 41, None)]
    assert zones_in_order(spans) == ["us-a", "us-b", "us-a"]


def test_summary_fields():
    samples = [S(0, "j-1", "a", "training", 0, None, 0), S(40, "j-1", "a", "preempting", 100, 100),
               S(50, "j-2", "b", "training", 100, 100, 100), S(90, "j-2", "b", "exited", 300, 300)]
    out = summarize(run(samples, [Lifetime("j-1", "us-a", 0, 45), Lifetime("j-2", "us-b", 46, 95)]))
    assert out["final_step"] == 300 and out["lost_steps"] == 0 and out["max_live_nodes"] == 1
    assert out["zones"] == ["us-a", "us-b"]
    # 300 steps at 0.25 s each (80 s of training for 300 steps) over 100 s of wall time.
    assert out["goodput"] == pytest.approx(0.8)


def test_scenarios_are_strict():
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"name": "x", "preemptions": [{"at_step": 1, "at_seconds": 2}], "faults": {"dupe": 1}})
    assert info.value.errors == ["preemptions[0]: give exactly one of at_step or at_seconds",
                                 "faults.dupe: unknown field (check the spelling; unknown fields are not allowed)"]
    with pytest.raises(ScenarioError, match="notice_budget_seconds must be shorter"):
        parse_scenario({"name": "x", "notice_seconds": 3, "notice_budget_seconds": 5})
    assert default_scenario().zones[0].capacity[0].after_preemption == 1


def test_timeline_is_self_contained_html():
    tl = Timeline(title="demo <default>", wall_seconds=60, zones=["us-a", "us-b"],
                  nodes=[NodeSpan("j-1", "us-a", 0, 30, "preempted"), NodeSpan("j-2", "us-b", 35, 60)],
                  marks=[Mark(29, "notice", "j-1"), Mark(29.5, "emergency", "step 100")],
                  downtime=[(30, 40)], steps=[(1, 0), (29, 100), (41, 100), (60, 300)], summary={"state": "SUCCEEDED"})
    page = render_html(tl)
    assert page.startswith("<!doctype html>") and "<svg" in page and "demo &lt;default&gt;" in page
    assert "j-1: 0.0–30.0 s (preempted)" in page and "downtime 10.0 s" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from elsewhere
