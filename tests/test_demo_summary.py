"""The demo's measurements, computed from recorded heartbeats and node lifetimes."""

from __future__ import annotations

import re

import pytest

from sim.demo.scenario import ScenarioError, default_scenario, parse_scenario
from sim.demo.summary import HeartbeatSample as S
from sim.demo.summary import Lifetime, RunRecord, lives, lost_steps, max_live, summarize, zones_in_order
from respawn.app.timeline import Mark, NodeSpan, Timeline, render_html


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


def test_max_live_per_slot_counts_each_slots_own_overlap():
    members = [Lifetime("j-1", "a", 0, None, slot="0"), Lifetime("j-2", "a", 0, 10, slot="1"),
               Lifetime("j-3", "a", 10, None, slot="1")]
    assert summarize(run([], members))["max_live_per_slot"] == 1  # three live at once, one per slot
    twice = [*members, Lifetime("j-4", "a", 20, 30, slot="1")]  # a second node for slot 1 while j-3 lives
    assert summarize(run([], twice))["max_live_per_slot"] == 2
    assert summarize(run([], [Lifetime("j-1", "a", 0, None)]))["max_live_per_slot"] == 0


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


def test_a_slices_workers_make_one_life_per_slice():
    # Each worker of a multi-host slice beats with its own agent life; worker 1 trains from 0 while worker 0 is
    # already at 100 in the first life's last sample. Counted as lives of their own, the replacement's worker 1
    # (resumed 100, last at 300) after the first slice's worker 0 is fine, but the first slice's worker 1 (started
    # at 0, resumed_from 0) after its worker 0 would read as 100 steps lost.
    samples = [S(0, "j-1", "a0", "training", 0, None, 0), S(1, "j-1", "a1", "training", 0, None, 0, worker=1),
               S(40, "j-1", "a0", "preempting", 100, 100), S(40, "j-1", "a1", "preempting", 100, 100, worker=1),
               S(50, "j-2", "b0", "training", 100, 100, 100), S(51, "j-2", "b1", "training", 100, 100, 100, worker=1),
               S(90, "j-2", "b0", "exited", 300, 300), S(90, "j-2", "b1", "exited", 300, 300, worker=1)]
    assert [(life.node, life.life) for life in lives(samples)] == [("j-1", "a0"), ("j-2", "b0")]
    out = summarize(run(samples, [Lifetime("j-1", "us-a", 0, 45), Lifetime("j-2", "us-b", 46, 95)]))
    assert out["lost_steps"] == 0 and out["final_step"] == 300
    assert out["workers"] == {"j-1": [0, 1], "j-2": [0, 1]}
    page = render_html(Timeline(title="t", wall_seconds=100, zones=["us-a"], nodes=[NodeSpan("j-1", "us-a", 0, 45, workers=2)]))
    assert "j-1 ×2 workers" in page and "(running, 2 workers)" in page


def test_scenarios_are_strict():
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"name": "x", "preemptions": [{"at_step": 1, "at_seconds": 2}], "faults": {"dupe": 1}})
    assert info.value.errors == ["preemptions[0]: give exactly one of at_step or at_seconds",
                                 "faults.dupe: unknown field (check the spelling; unknown fields are not allowed)"]
    with pytest.raises(ScenarioError, match="notice_budget_seconds must be shorter"):
        parse_scenario({"name": "x", "notice_seconds": 3, "notice_budget_seconds": 5})
    assert default_scenario().zones[0].capacity[0].after_preemption == 1
    job = {"nodes": 3}
    for bad, why in (({"slot": 1, "slots": [2]}, "not both"), ({"slots": [1, 1]}, "each member slot once"),
                     ({"slots": [1, 2], "when": "joined"}, "give slot"), ({"slots": [3]}, "below job.nodes")):
        with pytest.raises(ScenarioError, match=why):
            parse_scenario({"name": "x", "job": job, "preemptions": [{"at_step": 1, **bad}]})
    assert parse_scenario({"name": "x", "job": job, "preemptions": [{"at_step": 1, "slots": [2, 1]}]}
                          ).preemptions[0].targets() == [2, 1]


def test_timeline_is_self_contained_html():
    tl = Timeline(title="demo <default>", wall_seconds=60, zones=["us-a", "us-b"],
                  nodes=[NodeSpan("j-1", "us-a", 0, 30, "preempted"), NodeSpan("j-2", "us-b", 35, 60)],
                  marks=[Mark(29, "notice", "j-1"), Mark(29.5, "emergency", "step 100")],
                  downtime=[(30, 40)], progress=[[(1, 0), (29, 100)], [(41, 100), (60, 300)]], total_steps=300,
                  summary={"state": "SUCCEEDED"})
    page = render_html(tl)
    assert page.startswith("<!doctype html>") and "<svg" in page and "demo &lt;default&gt;" in page
    assert "j-1: 0.0–30.0 s (preempted)" in page and "downtime 10.0 s" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from elsewhere


def drawn_progress(page: str) -> list[list[tuple[float, float]]]:
    """The step lines the report page draws (respawn.app.timeline): one list of (x, y) per polyline (SVG y grows
    downwards)."""
    return [[tuple(map(float, pt.split(","))) for pt in m.group(1).split()]
            for m in re.finditer(r'<polyline class="progress"[^>]* points="([^"]*)"', page)]


def assert_each_line_rises(page: str) -> None:
    lines = drawn_progress(page)
    assert lines, "no step line drawn"
    for line in lines:
        xs, ys = [x for x, _ in line], [y for _, y in line]
        assert xs == sorted(xs) and ys == sorted(ys, reverse=True), f"a step line goes back: {line}"


def test_the_live_view_shows_a_slices_workers():
    import io

    from rich.console import Console

    from sim.demo.live import LiveView, _panel
    from sim.demo.runner import Progress

    p = Progress(scenario="s", job_id="j", state="RUNNING", node="j-1", step=10, total_steps=100,
                 workers=[(0, "training", 10), (1, "preparing", None)])
    stream = io.StringIO()
    LiveView(enabled=False, stream=stream).update(p)
    assert "workers=w0:training,w1:preparing" in stream.getvalue()
    console = Console(file=io.StringIO(), width=120)
    console.print(_panel(p))
    assert "w0 training 10  w1 preparing -" in console.file.getvalue()
    single = io.StringIO()
    LiveView(enabled=False, stream=single).update(Progress(scenario="s", job_id="j", workers=[(0, "training", 1)]))
    assert "workers" not in single.getvalue()


def test_the_live_view_keeps_the_last_step_during_a_recovery():
    import io

    from rich.console import Console

    from sim.demo.live import LiveView, _panel
    from sim.demo.runner import Progress

    stream = io.StringIO()
    view = LiveView(enabled=False, stream=stream)
    view.update(Progress(scenario="s", job_id="j", state="PENDING"))
    assert "step=- committed=-" in stream.getvalue()  # nothing reported yet: nothing to keep
    view.update(Progress(scenario="s", job_id="j", state="RUNNING", node="j-1", step=93, committed=90,
                         total_steps=300))
    gone = Progress(scenario="s", job_id="j", state="PROVISIONING", total_steps=300)  # the node is gone
    view.update(gone)
    assert stream.getvalue().splitlines()[-1].endswith("step=93/300 (recovering) committed=90 live=0")
    console = Console(file=io.StringIO(), width=120)
    console.print(_panel(gone, (93, 90)))
    assert "93/300 (recovering)" in console.file.getvalue()
    # An event's details are printed as written, not read as Rich markup.
    console.print(_panel(Progress(scenario="s", job_id="j", events=["moved [from us-central1-a]"])))
    assert "moved [from us-central1-a]" in console.file.getvalue()


def test_the_summary_tells_each_recovery_as_its_recovered_event_recorded_it():
    # The controller's figure (recovery_time.Recovery.fields), as the job's `recovered` events carry it: the summary
    # takes it as it is, so that it is the number Slack, the events and the report show.
    recovered = [{"recovery_seconds": 9.8, "notice_at": "2026-11-28T04:00:00+00:00", "steps_lost": 0,
                  "stepping_at": "2026-11-28T04:00:09.800000+00:00", "furthest_step": 61, "resumed_from": 61,
                  "loss_cause": "preempted", "generation": 2, "node": "j-2"}]
    out = summarize(RunRecord("j", 100, 40, "SUCCEEDED", 1, [], [], recovered=recovered))
    assert out["recovery_seconds"] == [9.8]
    assert out["recoveries"] == [{k: v for k, v in recovered[0].items() if k not in ("generation", "node")}]
    assert summarize(RunRecord("j", 100, 40, "SUCCEEDED", 0, [], []))["recovery_seconds"] == []


def test_a_node_in_its_notice_does_not_count_as_a_second_node_of_its_slot():
    # The replacement boots while the noticed node saves (the controller acts on the notice).
    lifetimes = [Lifetime("j-1", "a", 0, 40, slot="0"), Lifetime("j-2", "b", 32, None, slot="0")]
    rec = run([], lifetimes)
    assert (summarize(rec)["max_live_nodes"], summarize(rec)["max_live_per_slot"]) == (2, 2)
    rec.noticed = {"j-1": 30.0}
    assert (summarize(rec)["max_live_nodes"], summarize(rec)["max_live_per_slot"]) == (1, 1)
    rec.noticed = {"j-1": 35.0}  # a replacement up before the notice would still be two
    assert summarize(rec)["max_live_per_slot"] == 2


def test_the_summarys_figures_are_the_records():
    """summarize counts steps lost as the recoveries' events recorded them, and from_record puts the report's figures
    (respawn.app.report.figures, computed once from the job's record) in place of those measured from samples."""
    from respawn.app import report
    from sim.demo.summary import from_record

    # The samples see life 1 reach step 130 and life 2 start from 100: 30 steps redone. The record's two recoveries
    # say 10 and 9 (an emergency save kept some): the summary says the record's 19.
    samples = [S(1, "j-1", "a", "training", 10, 0, 0), S(20, "j-1", "a", "training", 130, 100),
               S(30, "j-2", "b", "training", 101, 100, 100), S(60, "j-2", "b", "exited", 300, 300)]
    recovered = [{"recovery_seconds": 9.8, "steps_lost": 10}, {"recovery_seconds": 6.4, "steps_lost": 9}]
    rec = RunRecord("j", 300, 100, "SUCCEEDED", 2, samples, [], recovered=recovered)
    assert lost_steps(lives(samples)) == 30 and summarize(rec)["lost_steps"] == 19
    assert summarize(RunRecord("j", 300, 100, "SUCCEEDED", 2, samples, [], recovered=[{"steps_lost": None}]))[
        "lost_steps"] is None
    # The report's figures of a recorded job (tests/test_report.py's): they replace the summary's own.
    from test_report import BEATS, DOC, EVENTS, at

    figures = report.figures(report.of_record("j", DOC, EVENTS, BEATS, at(400)))
    out = from_record({**summarize(rec), "cost": "$0.0259 (on demand $0.0777; offline table (z))"}, figures)
    assert (out["goodput"], out["lost_steps"], out["recovery_seconds"], out["notice_seconds"]) == (
        round(158 / 300, 4), 8, [90.0], [100.0])
    assert out["goodput_buckets"] == figures["buckets_seconds"] and out["saved_vs_on_demand"] == 0.6667
    assert out["cost"] == "$0.0259 (on demand $0.0777; offline table (z)); saved against on demand: 67%"
