"""One record, every page (issue 46 item 2): the default demo scenario run once and kept up (--keep), then read
as a user reads it — the demo's summary (--json), `respawn jobs describe` (--json and the table), `respawn jobs
report --json`, the report page in a real headless Chromium, and the Slack alerts the run sent. Each must show the
figures the job's record gives (respawn.app.report.figures): the same goodput, steps lost, recovery times, notice
times and cost, and Slack's breakdown of each recovery's time adds up to it. One demo run serves every assertion."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import demo_pages
import kept_demo
from browser_fixtures import browser, open_page  # noqa: F401 - fixture
from respawn.agent.supervisor import processes_with
from respawn.control import recovery_time
from respawn.prices import usd


@dataclass
class Pages:
    summary: dict  # the demo's --json
    described: dict  # jobs describe --json
    described_text: str  # jobs describe, for a person
    reported: dict  # jobs report --json
    page: Path  # the report page the demo wrote


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Pages:
    tmp = tmp_path_factory.mktemp("pages")
    token = uuid.uuid4().hex
    proc, summary, exports = kept_demo.start(tmp, token)  # the default scenario
    try:
        cli = {**os.environ, **exports, "COLUMNS": "200"}
        job = summary["job_id"]

        def respawn(*argv: str) -> str:
            r = subprocess.run([sys.executable, "-m", "respawn", "jobs", *argv], env=cli, capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            return r.stdout

        out = Pages(summary, json.loads(respawn("describe", job, "--json")), respawn("describe", job),
                    json.loads(respawn("report", job, "-o", str(tmp / "report.html"), "--json")),
                    Path(summary["report"]))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert processes_with(f"RESPAWN_DEMO_TEST={token}".encode()) == []
    return out


def test_every_page_shows_the_records_figures(pages, browser):
    f = pages.described["figures"]
    # The default scenario: two preemptions, each recovered; the figures are the record's, computed once.
    assert f["state"] == "SUCCEEDED" and len(f["recovery_seconds"]) == 2 and f["preemptions"] == 2
    assert {k: v for k, v in pages.reported.items() if k not in ("id", "report")} == f
    times = [recovery_time.text(s) for s in f["recovery_seconds"]]
    cost = f"{usd(f['cost']['so_far_usd'])} (on demand {usd(f['cost']['on_demand_usd'])}"

    # The report page, in Chromium: its headline and its table of recoveries (notice times on the chart's axis).
    page, errors = open_page(browser, pages.page, screenshot="report-default-demo.png")
    assert errors == []
    headline = {x.get_attribute("data-figure"): x.locator(".value").inner_text()
                for x in page.locator(".headline .figure").all()}
    assert (headline["goodput"], headline["steps_lost"], headline["recoveries"], headline["cost"],
            headline["saved"]) == (f"{f['goodput']:.1%}", str(f["steps_lost"]), ", ".join(times), cost + ")",
                                   f"{f['cost']['saved']:.0%}")
    rows = [row.locator("td").all_inner_texts() for row in page.locator("table.recoveries tr").all()[1:]]
    assert [(r[0], r[3].split(" (")[0], r[4]) for r in rows] == [
        (f"{x['at_seconds']:.1f} s", recovery_time.text(x["seconds"]), str(x["steps_lost"])) for x in f["recoveries"]]

    # The summary: steps lost and each recovery's time as the record says them, its cost the ledger's.
    s = pages.summary
    assert (s["lost_steps"], s["recovery_seconds"]) == (f["steps_lost"], f["recovery_seconds"])
    assert s["cost"].startswith(cost + ";")

    # describe, for a person: the same words.
    text = pages.described_text
    assert re.search(rf"^goodput +{re.escape(headline['goodput'])} *$", text, re.M), text
    assert re.search(rf"^steps lost +{f['steps_lost']} *$", text, re.M) and cost in text
    for x in f["recoveries"]:
        assert re.search(rf"│ {x['at_seconds']:.1f} s +│ preempted {x['node']} +│ [^│]+│ {x['seconds']:.1f} s +│ "
                         rf"{x['steps_lost']} +│", text), text  # time, loss, zone, recovery time, steps lost

    # Slack: each recovered alert's recovery time and steps lost.
    told = [re.search(r"recovery time: ([\d.]+ s); steps lost: (\d+)", a) for a in s["alerts"]
            if a.startswith(f"Job {s['job_id']} recovered")]
    assert [(m.group(1), int(m.group(2))) for m in told if m] == [
        (recovery_time.text(x["seconds"]), x["steps_lost"]) for x in f["recoveries"]]


def test_the_shared_checker_reads_the_same_figures(pages):
    """What every scenario's test asserts (demo_pages, on the page's text), here with describe --json too."""
    demo_pages.assert_pages_agree(pages.page.parent, pages.summary, pages.described["figures"])


def test_the_summarys_goodput_and_notice_times_are_the_records(pages):
    f = pages.described["figures"]
    assert (pages.summary["goodput"], pages.summary.get("notice_seconds")) == (
        f["goodput"], [x["at_seconds"] for x in f["recoveries"]])


def test_slacks_breakdown_names_every_part(pages):
    said = [re.search(r"this preemption cost ([\d.]+) s: ([^(;]*[^ (;])", a) for a in pages.summary["alerts"]
            if a.startswith(f"Job {pages.summary['job_id']} recovered")]
    assert len(said) == 2 and all(said)
    for m in said:  # "cost 9.2 s: 1.0 s agent and setup, 7.0 s trainer start…" added up to 8.0
        parts = [float(x) for x in re.findall(r"(?:^|, )([\d.]+) s ", m.group(2))]
        assert round(sum(parts), 1) == float(m.group(1)), m.group(0)
