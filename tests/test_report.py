"""respawn/app/report.py (and respawn.control.goodput): a job's lives, recoveries and goodput buckets from its events
and its nodes' heartbeats (pure), `respawn jobs report` against the Firestore emulator, and the page in a real headless
Chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from browser_fixtures import browser, open_page  # noqa: F401 - fixture
from respawn import schema
from respawn.app import report
from respawn.control.goodput import BUCKETS
from respawn.schema import Heartbeat, JobEvent, State

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def ev(s: float, frm, to, why, **details) -> JobEvent:
    return JobEvent(at=at(s), from_state=frm and State(frm), to_state=State(to), cause=why, details=details)


def lost(node, started, first_step, first_at, step, committed, beat):
    return {"node": node, "started_at": at(started).isoformat(), "first_step": first_step,
            "first_step_at": at(first_at).isoformat(), "step": step, "committed_step": committed,
            "heartbeat_at": at(beat).isoformat()}


# A job preempted at 100 s (node j-1's start in place refused), moved to j-2, which finished at 300 s.
EVENTS = [
    ev(0, None, "PENDING", "registered"),
    ev(1, "PENDING", "PROVISIONING", "job_created", node="j-1", attempt=1, zone="z-a", provisioning="spot"),
    ev(11, "PROVISIONING", "RUNNING", "node_running", node="j-1", attempt=1, zone="z-a"),
    # j-1: trainer at 31 s, first step (0 → 1) seen at 41 s, last beat at 99 s at step 58, committed 50 (no
    # emergency save fitted): 8 steps of its 58 are redone.
    ev(100, "RUNNING", "PROVISIONING", "preempted", node="j-1", attempt=1, zone="z-a", in_place=True,
       lost=lost("j-1", 31, 0, 41, 58, 50, 99)),
    ev(101, "PROVISIONING", "PREEMPTED", "zone_refused_capacity", node="j-1", zone="z-a", code="STOCKOUT"),
    ev(102, "PREEMPTED", "PROVISIONING", "replacement", node="j-2", attempt=2, zone="z-b", provisioning="flex-start"),
    ev(130, "PROVISIONING", "RUNNING", "node_running", node="j-2", attempt=2, zone="z-b"),
    # The recovery as the controller measured it (recovery_time): its notice at 100 s, j-2's first step at 190 s.
    ev(192, "RUNNING", "RUNNING", "recovered", node="j-2", attempt=2, zone="z-b", recovery_seconds=90.0,
       notice_at=at(100).isoformat(), stepping_at=at(190).isoformat(), steps_lost=8, furthest_step=58,
       resumed_from=50, loss_cause="preempted"),
    ev(300, "RUNNING", "SUCCEEDED", "trainer_succeeded", node="j-2", attempt=2, zone="z-b"),
]
BEATS = {"j-2": Heartbeat(job_id="j", attempt=2, state="exited", step=100, committed_step=100, first_step=51,
                          started_at=at(160), first_step_at=at(190), heartbeat_at=at(298))}


def test_lives_recoveries_and_buckets_follow_the_events_and_the_heartbeats():
    r = report.build("j", "SUCCEEDED", T0, at(300), EVENTS, BEATS)
    assert [(x.node, x.zone, x.model, x.end_cause) for x in r.lives] == [
        ("j-1", "z-a", "spot", "preempted"), ("j-2", "z-b", "flex-start", "succeeded")]
    assert r.refused == 1  # the start in place that the zone refused made no run
    [rec] = r.recoveries
    assert (rec.lost, rec.cause, rec.seconds, rec.steps_lost, rec.training_at) == ("j-1", "preempted", 90.0, 8, at(190))
    # An older controller's `recovered` event, without the figure: from the loss to the event.
    older = [e if e.cause != "recovered" else e.model_copy(update={"details": {"node": "j-2"}}) for e in EVENTS]
    assert [(x.lost, x.seconds) for x in report.build("j", "SUCCEEDED", T0, at(300), older, BEATS).recoveries] == [
        ("j-1", 92.0)]
    # A last run that finished before a reconcile saw it step: the job's end tells its recovery (recovery_time.told).
    [told] = [e for e in EVENTS if e.cause == "recovered"]
    quick = [e for e in EVENTS if e is not told]
    quick[-1] = quick[-1].model_copy(update={"details": {**quick[-1].details, **told.details}})
    [fast] = report.build("j", "SUCCEEDED", T0, at(300), quick, BEATS).recoveries
    assert (fast.lost, fast.seconds, fast.steps_lost, fast.training_at) == ("j-1", 90.0, 8, at(190))
    assert report.event_words(quick[-1]) == ("j-2: trainer succeeded in z-b; recovered in 90.0 s (notice → every rank "
                                             "stepping), 8 steps lost (preempted); resumed from step 50")
    assert r.goodput == {
        # j-1 stepped 41..99 s over steps 0..58, kept 0..50; j-2 stepped 190..298 s, all kept.
        "productive_training": pytest.approx(58 * 50 / 58 + 108),
        "wasted_progress_from_disruption": pytest.approx(58 * 8 / 58),
        "infrastructure_recovery_from_disruption": 30.0,  # the loss at 100 s → j-2 running at 130 s
        "program_startup": 11.0 + 20.0 + 30.0,  # registration → j-1 running; VM → trainer, twice
        "training_prep": 10.0 + 30.0,
        "other": 1.0 + 2.0,  # j-1's last beat → the loss; j-2's last beat → the end
    }
    assert sum(r.goodput.values()) == pytest.approx(r.wall_seconds) == 300
    assert r.goodput_ratio == pytest.approx(158 / 300)


def test_a_run_ended_by_a_restart_in_place_is_a_life_of_its_own():
    events = [*EVENTS[:4], ev(115, "PROVISIONING", "RUNNING", "node_running", node="j-1", attempt=1, zone="z-a"),
              ev(200, "RUNNING", "SUCCEEDED", "trainer_succeeded", node="j-1", attempt=1, zone="z-a")]
    beats = {"j-1": Heartbeat(job_id="j", attempt=1, state="exited", step=90, committed_step=90, first_step=51,
                              started_at=at(130), first_step_at=at(140), heartbeat_at=at(199))}
    r = report.build("j", "SUCCEEDED", T0, at(200), events, beats)
    first, second = r.lives
    assert (first.node, first.step, first.ended_at) == ("j-1", 58, at(100))  # from the loss event's `lost`
    assert (second.node, second.running_at, second.first_step, second.step) == ("j-1", at(115), 51, 90)
    assert r.goodput["infrastructure_recovery_from_disruption"] == 15.0


def test_the_cli_writes_the_page_and_its_figures_match_the_events(firestore_db, nodes_db, project, tmp_path):
    ref = firestore_db.collection(schema.JOBS).document("j")
    ref.set({"spec": {"zones": ["z-a", "z-b"]}, "created_at": T0,
             "status": schema.JobStatus(state=State.SUCCEEDED, total_steps=100).model_dump()})
    for e in EVENTS:
        ref.collection(schema.EVENTS).add(e.model_dump())
    for node, hb in BEATS.items():
        nodes_db.collection(schema.NODES).document(node).set(hb.model_dump())
    page = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "respawn", "jobs", "report", "j", "-o", str(page), "--json",
                        "--project", project], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert (figures["lives"], figures["refused_creates"], figures["wall_seconds"]) == (2, 1, 300.0)
    # The recovery's figure as its `recovered` event carries it, in the report and in `jobs describe`; where its time
    # went (the replacement's create at 102 s, running at 130 s, trainer at 160 s) adds up to it.
    [told] = figures["recoveries"]
    assert {k: told[k] for k in ("node", "cause", "at", "at_seconds", "seconds", "steps_lost", "zone", "new_zone",
                                 "outcome")} == {
        "node": "j-1", "cause": "preempted", "at": at(100).isoformat(), "at_seconds": 100.0, "seconds": 90.0,
        "steps_lost": 8, "zone": "z-a", "new_zone": "z-b", "outcome": "recovered"}
    assert told["stages"] == {"waiting_for_capacity": 2.0, "vm_create_and_boot": 28.0, "setup": 30.0,
                              "restore_and_first_step": 30.0}
    assert (figures["steps_lost"], figures["recovery_seconds"]) == (8, [90.0])
    assert figures["buckets_seconds"]["infrastructure_recovery_from_disruption"] == 30.0
    html = page.read_text()
    assert 'data-node="j-1"' in html and 'data-node="j-2"' in html and "j-2 trainer succeeded in z-b" in html
    assert "data-figure='steps'><div class='value'>- of 100</div>" in html  # the status holds no step
    described = subprocess.run([sys.executable, "-m", "respawn", "jobs", "describe", "j", "--project", project,
                                "--json"], capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    record = json.loads(described.stdout)
    assert record["figures"] == {k: v for k, v in figures.items() if k not in ("id", "report")}
    assert record["figures"]["goodput"] == round(158 / 300, 4) and record["status"]["state"] == "SUCCEEDED"
    # For a person: a table, the same figures in words.
    said = subprocess.run([sys.executable, "-m", "respawn", "jobs", "describe", "j", "--project", project],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
    assert said.returncode == 0, said.stderr
    row = next(line for line in said.stdout.splitlines() if "preempted j-1" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")] == [
        "100.0 s", "preempted j-1", "z-a → z-b", "90.0 s", "8", "$0.0000"]
    assert ("100.0 s preempted j-1: 90.0 s = 2.0 s waiting for capacity, 28.0 s VM create and boot, 30.0 s agent and "
            "setup, 30.0 s trainer start, restore and first step") in said.stdout
    assert "goodput 52.7% of 300.0 s" in said.stdout
    assert re.search(r"│ waiting for a new VM +│ 30\.0 s +│ 10% +│", said.stdout)
    assert re.search(r"^steps lost +8 *$", said.stdout, re.M) and re.search(r"^goodput +52\.7% *$", said.stdout, re.M)
    # jobs report's lines: the figures, the buckets in the page's words (one vocabulary), not the metric keys.
    lines = subprocess.run([sys.executable, "-m", "respawn", "jobs", "report", "j", "-o", str(page), "--project",
                            project], capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert lines[:3] == ["job j SUCCEEDED: 2 node lives, 1 loss (1 recovered), goodput 52.7% of 300 s",
                         "  training: 158.0 s (53%)", "  redone after a loss: 8.0 s (3%)"]
    missing = subprocess.run([sys.executable, "-m", "respawn", "jobs", "report", "nope", "--project", project],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no job 'nope'" in missing.stderr


# The job's record the page is built from: its document (the status: steps, preemptions, the cost ledger).
DOC = {"spec": {"zones": ["z-a", "z-b"]}, "created_at": T0, "status": schema.JobStatus(
    state=State.SUCCEEDED, total_steps=100, last_step=100, last_committed_step=100, preemptions=1,
    cost=schema.CostLedger(closed_usd=0.0259, closed_on_demand_usd=0.0777, note="offline table (z)")).model_dump()}


def test_the_page_answers_the_user_in_chromium(browser, tmp_path):
    r = report.of_record("j", DOC, EVENTS, BEATS, at(400))
    path = tmp_path / "report.html"
    path.write_text(report.render(r, ["z-a", "z-b"], EVENTS))
    page, errors = open_page(browser, path, screenshot="report-page.png")
    assert errors == []
    # The headline, each figure from the record: the status, the `recovered` event's figure, the ledger, the buckets.
    status = schema.JobStatus.model_validate(DOC["status"])
    [told] = [e.details for e in EVENTS if e.cause == "recovered"]
    ran = (100 - 11) + (300 - 130)  # seconds a node ran: j-1 from running to its loss, j-2 to the end
    headline = {f.get_attribute("data-figure"): f.locator(".value").inner_text()
                for f in page.locator(".headline .figure").all()}
    assert headline == {
        "state": "succeeded",
        "steps": f"{status.last_step} of {status.total_steps}",
        "preemptions": str(status.preemptions),
        "recoveries": f"{told['recovery_seconds']:.1f} s",
        "steps_lost": str(told["steps_lost"]),
        "cost": f"${status.cost.closed_usd:.4f} (on demand ${status.cost.closed_on_demand_usd:.4f})",
        "saved": f"{1 - status.cost.closed_usd / status.cost.closed_on_demand_usd:.0%}",
        "cost_per_recovery": f"${told['recovery_seconds'] * status.cost.closed_usd / ran:.4f}",
        "goodput": f"{158 / 300:.1%}",
    }
    assert page.locator("rect.life").count() == 2
    assert page.locator("rect.life").nth(1).get_attribute("data-model") == "flex-start"
    assert page.locator("polyline.progress").count() == 2
    # The notice where it came (100 s on the chart's axis), the recovery time drawn from it; j-1's last checkpoint
    # (step 50, not its last step 58) is no emergency save; the legend names only what is drawn.
    assert page.locator("line.mark.notice title").text_content() == "notice at 100.0 s preempted j-1"
    assert page.locator(".recovery + text").text_content() == "recovery 90.0 s"
    assert page.locator(".mark.emergency").count() == 0 and page.locator(".mark.checkpoint").count() == 2
    legend = page.locator("p.legend").inner_text()
    assert "notice" in legend and "flex-start" in legend and "downtime" in legend
    assert not any(w in legend for w in ("emergency", "crash", "standard", "preemptible"))
    # The buckets in words, adding up to the wall time; every event in words at its time on the chart's axis.
    goodput = page.locator("table.goodput td:first-child").all_inner_texts()
    assert goodput == [report.BUCKET_WORDS[k][0] for k in BUCKETS]
    events = [row.locator("td").all_inner_texts() for row in page.locator("table.events tr").all()[1:]]
    assert len(events) == len(EVENTS)
    assert events[3] == ["100.0 s", "RUNNING → PROVISIONING", "j-1 preempted in z-a (last heard at step 58, "
                                                               "committed 50); restarting it in place"]
    assert events[4][2] == "z-a refused j-1: no capacity (STOCKOUT)"
    assert events[7][2] == ("j-2: recovered in 90.0 s (notice → every rank stepping), 8 steps lost (preempted); "
                            "resumed from step 50")
    assert not any("{" in cell or "=" in cell for row in events for cell in row)  # no dict reprs


def test_an_emergency_save_is_drawn_on_the_step_line():
    # j-1 last heard at step 58, committed 50; the notice's emergency save committed 58 after that heartbeat, and the
    # recovery resumed from it: nothing lost. Drawn at the loss, over the rest, labelled with the step it kept.
    events = [e.model_copy(update={"details": {**e.details, "resumed_from": 58, "steps_lost": 0}})
              if e.cause == "recovered" else e for e in EVENTS]
    page = report.render(report.of_record("j", DOC, events, BEATS, at(400)), ["z-a", "z-b"], events)
    assert page.count('class="mark emergency"') == 1 and ">emergency save 58</text>" in page
    assert "emergency at 100.0 s j-1 committed step 58" in page
    assert page.index('class="mark checkpoint"') < page.index('class="mark emergency"')  # drawn last, on top
    assert "emergency save" in page[page.index("class='legend'"):]


# A job whose trainer raises at once on every node (as `respawn demo --job` records it): four crashes, no step, FAILED.
def crash_events() -> list[JobEvent]:
    out = [ev(0, None, "PENDING", "registered")]
    for i, t in enumerate((1, 11, 21, 31)):
        node, zone = f"c-{i + 1}", ("z-a", "z-b")[i % 2]
        out.append(ev(t, "PENDING" if i == 0 else "RESTARTING", "PROVISIONING", "job_created" if i == 0 else
                      "replacement", node=node, attempt=i + 1, zone=zone, provisioning="spot"))
        out.append(ev(t + 5, "PROVISIONING", "RUNNING", "node_running", node=node, attempt=i + 1, zone=zone))
        gone = {"node": node, "started_at": at(t + 6).isoformat(), "first_step": None, "first_step_at": None,
                "step": None, "committed_step": None, "heartbeat_at": at(t + 7).isoformat()}
        out.append(ev(t + 8, "RUNNING", "FAILED" if i == 3 else "RESTARTING", "trainer_crashed", node=node,
                      attempt=i + 1, zone=zone, last_error="ValueError: bad lr", lost=gone))
    return out


CRASH_DOC = {"spec": {"zones": ["z-a", "z-b"]}, "created_at": T0, "status": schema.JobStatus(
    state=State.FAILED, failures=4, preemptions=0, last_cause="trainer_crashed",
    cost=schema.CostLedger(closed_usd=0.0011, closed_on_demand_usd=0.0020, note="offline table (z)")).model_dump()}


def test_a_crashing_job_reads_as_crashes_not_preemptions(browser, tmp_path):
    """A trainer that raises at once: no notice came, nothing recovered, no step was kept, so nothing was saved; the
    trainer's error is on the page."""
    events = crash_events()
    r = report.of_record("c", CRASH_DOC, events, {}, at(60))
    f = report.figures(r)
    assert [x["outcome"] for x in f["recoveries"]] == ["never"] * 4
    assert (f["steps_lost"], f["recovery_seconds"], f["cost"]["saved"]) == (0, [], None)
    path = tmp_path / "report.html"
    path.write_text(report.render(r, ["z-a", "z-b"], events))
    page, errors = open_page(browser, path, screenshot="report-failed-page.png")
    assert errors == []
    headline = {f.get_attribute("data-figure"): f.locator(".value").inner_text()
                for f in page.locator(".headline .figure").all()}
    assert headline == {
        "state": "failed", "preemptions": "0", "failures": "4", "last_error": "ValueError: bad lr",
        "recoveries": "4 losses never stepped again", "steps_lost": "0", "cost": "$0.0011 (on demand $0.0020)",
        "saved": "none (no step was kept)", "goodput": "0.0%"}
    # Drawn as crashes (no notice came), with no recovery bar and no emergency save.
    assert page.locator("line.mark.notice").count() == 0 and page.locator(".recovery").count() == 0
    assert page.locator("line.mark.crash title").all_text_contents() == [
        f"crash at {t:.1f} s trainer crashed c-{i + 1}: ValueError: bad lr" for i, t in enumerate((9, 19, 29, 39))]
    legend = page.locator("p.legend").inner_text()
    assert "crash (the job's own failure: no notice)" in legend and "■ notice" not in legend
    # No emergency save column: no notice came, so no save to tell of.
    assert page.locator("table.recoveries th").all_inner_texts() == [
        "time", "loss", "zone", "recovery time (where it went)", "steps lost", "last error"]
    rows = [row.locator("td").all_inner_texts() for row in page.locator("table.recoveries tr").all()[1:]]
    assert rows[0] == ["9.0 s", "trainer crashed c-1", "z-a", "never stepped again", "-", "ValueError: bad lr"]
    assert len(rows) == 4


def test_the_emergency_saves_outcome_and_the_error_are_told_where_the_record_has_them():
    # The recovery tells how the noticed node's save ended (its final heartbeat came after the loss event).
    failed = {"state": "failed", "step": None, "reason": "rank 1: RuntimeError: disk full"}
    events = [e.model_copy(update={"details": {**e.details, "emergency": failed}}) if e.cause == "recovered" else e
              for e in EVENTS]
    r = report.of_record("j", DOC, events, BEATS, at(400))
    [x] = report.figures(r)["recoveries"]
    assert x["emergency"] == failed and x["last_error"] is None
    [row] = report.recovery_rows(report.figures(r))
    assert row[5] == "emergency save failed on rank 1: RuntimeError: disk full"
    [told] = [e for e in events if e.cause == "recovered"]
    assert report.event_words(told).endswith("; resumed from step 50; emergency save failed on rank 1: RuntimeError: "
                                             "disk full")
    # A failed save is drawn as none, though the step resumed from is the last one reached (a periodic checkpoint).
    kept = [e.model_copy(update={"details": {**e.details, "resumed_from": 58, "steps_lost": 0}})
            if e.cause == "recovered" else e for e in events]
    page = report.render(report.of_record("j", DOC, kept, BEATS, at(400)), ["z-a", "z-b"], kept)
    assert 'class="mark emergency"' not in page and "emergency at" not in page
    crash = crash_events()[3]
    assert report.event_words(crash) == "c-1 trainer crashed in z-a: ValueError: bad lr"


def test_downtime_is_drawn_where_no_trainer_stepped():
    # j-1 stepped 41..99 s, j-2 190..298 s: no trainer stepped before 41 s nor from 99 to 190 s.
    r = report.of_record("j", DOC, EVENTS, BEATS, at(400))
    page = report.render(r, ["z-a", "z-b"], EVENTS)
    assert re.findall(r"<title>downtime ([\d.]+) s</title>", page) == ["41.0", "91.0"]
    assert report.downtime([], 10) == []


def test_a_life_lost_as_its_first_step_is_told_stops_at_that_step_not_before():
    """Its end was recorded 0.1 s before its first step's heartbeat (move-master-lost: a new master lost as it joins):
    the page's step line for it must not go back in time."""
    from respawn.control.goodput import Life, training_end

    t0 = datetime(2026, 12, 7, tzinfo=timezone.utc)
    end, first = t0 + timedelta(seconds=10), t0 + timedelta(seconds=10.1)
    life = Life(slot=0, node="j-7", attempt=7, zone="us-central1-b", model="spot", created_at=t0, ended_at=end,
                first_step=235, first_step_at=first, step=235, last_beat_at=first)
    assert training_end(life, end) == first
    later = Life(slot=0, node="j-8", attempt=8, zone="us-central1-b", model="spot", created_at=t0, ended_at=end,
                 first_step=235, first_step_at=t0 + timedelta(seconds=2), step=240, last_beat_at=first)
    assert training_end(later, end) == end  # the usual case: the last beat within the life
