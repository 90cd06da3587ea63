"""One record, every page (issue 46 item 2): the default demo scenario run once and kept up (--keep) with a job file
of the user's own (`respawn demo --job examples/jobs/gpu-spot-small.yaml`), then read as a user reads it — the
demo's summary (--json), `respawn jobs describe` (--json and the table), `respawn jobs events`, `respawn jobs report
--json`, the report page in a real headless Chromium, and the Slack alerts the run sent. Each must show the figures
the job's record gives (respawn.app.report.figures): the same goodput, steps lost, recovery times, notice times and
cost, and Slack's breakdown of each recovery's time adds up to it. One demo run serves every assertion: the README's
first command runs the built-in default scenario itself, and .ci/check-demo reads its output."""

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
from respawn.control.goodput import BUCKETS
from test_demo_scenarios import check_common, check_recoveries


JOB = Path(__file__).resolve().parent.parent / "examples" / "jobs" / "gpu-spot-small.yaml"


@dataclass
class Pages:
    summary: dict  # the demo's --json
    described: dict  # jobs describe --json
    described_text: str  # jobs describe, for a person
    events: str  # jobs events, for a person
    reported: dict  # jobs report --json
    page: Path  # the report page the demo wrote
    folder: Path  # the demo's: out/ and its stderr
    exports: dict[str, str]  # what its export lines set
    kept: list[int]  # the stand-ins' pids --keep kept running, alive before the Ctrl-C
    stopped: subprocess.CompletedProcess  # the demo after Ctrl-C: its exit code, summary and stderr


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Pages:
    tmp = tmp_path_factory.mktemp("pages")
    token = uuid.uuid4().hex
    proc, summary, exports = kept_demo.start(tmp, token, "--job", str(JOB))  # the default scenario
    try:
        kept = [pid for pid in summary["kept"]["pids"] if pid in processes_with(f"RESPAWN_DEMO_TEST={token}".encode())]
        cli = {**os.environ, **exports, "COLUMNS": "200"}
        job = summary["job_id"]

        def respawn(*argv: str) -> str:
            r = subprocess.run([sys.executable, "-m", "respawn", "jobs", *argv], env=cli, capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            return r.stdout

        read = (json.loads(respawn("describe", job, "--json")), respawn("describe", job), respawn("events", job),
                json.loads(respawn("report", job, "-o", str(tmp / "report.html"), "--json")))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    stopped = subprocess.CompletedProcess(proc.args, proc.returncode, json.dumps(summary), (tmp / "stderr").read_text())
    assert processes_with(f"RESPAWN_DEMO_TEST={token}".encode()) == []
    return Pages(summary, *read, Path(summary["report"]), tmp, exports, kept, stopped)


def test_a_job_of_the_users_own_kept_for_the_cli(pages, browser):
    """`respawn demo --job`: a job file of the user's own (examples/jobs/gpu-spot-small.yaml, its trainer.workdir a
    directory: examples/workdir, the default example's) packed, uploaded and run through the default scenario, its
    own step count in the summary; the run shows what the default scenario must (check_default_run). With --keep the
    stand-ins outlive the job: `respawn jobs describe` and `events`, pointed at them by the printed export lines, see
    it; Ctrl-C then stops every process the demo started."""
    from respawn.app.workdir import pack

    out = pages.summary
    assert pages.exports == out["kept"]["env"] and pages.exports["GOOGLE_CLOUD_PROJECT"] == "respawn-local"
    assert pages.kept and pages.kept == out["kept"]["pids"], "--keep stopped the stand-ins"
    doc = pages.described
    assert doc["status"]["state"] == "SUCCEEDED" and doc["status"]["restarts"] == 2
    # The directory, packed as `respawn jobs register` packs it and uploaded to the storage emulator.
    assert doc["spec"]["trainer"]["workdir"].endswith(f"/sha256-{pack(JOB.parent / '../workdir').sha256}.tar.gz")
    assert pages.events.count("recovered") == 2 and "trainer_succeeded" in pages.events, pages.events
    said = pages.stopped.stderr
    assert "demo: stopped everything it started" in said.splitlines()[-1], said[-2000:]
    assert not [pid for pid in pages.kept if os.path.exists(f"/proc/{pid}")]
    check_common(pages.stopped, out, pages.folder)
    assert out["job_id"] == "gpu-spot-small" and out["total_steps"] == 240  # the job's own, not the example's 300
    check_default_run(pages.folder, out, browser)


def test_the_cli_fails_fast_once_the_kept_demo_has_ended(pages, tmp_path):
    """The kept demo's `export` lines copied, then Ctrl-C (issue 46's case): the hints it printed name respawn as it
    was started; with the exports still set, `jobs describe` and `jobs list` end in one line naming the stopped
    emulator and the `unset` to run (within 10 s: the probe's deadline; not asserted), not minutes of retries."""
    import shlex

    from test_cli_unreachable import assert_one_line, kept_env, timed

    job = pages.summary["job_id"]
    # `python -m respawn` as this test started it (its path as given, relative to the working directory under it).
    hint = next(x for x in pages.stopped.stderr.splitlines() if f" -m respawn jobs describe {job}; " in x)
    assert os.path.samefile(shlex.split(hint)[0], sys.executable), hint
    shell = kept_env(pages.exports["FIRESTORE_EMULATOR_HOST"], **pages.exports)
    for argv in (["jobs", "describe", job], ["jobs", "list"]):
        r, took = timed(argv, tmp_path, shell)
        assert_one_line(r, took, f"the Firestore emulator at {pages.exports['FIRESTORE_EMULATOR_HOST']} "
                                 "(FIRESTORE_EMULATOR_HOST) does not answer",
                        "unset FIRESTORE_EMULATOR_HOST PUBSUB_EMULATOR_HOST STORAGE_EMULATOR_HOST GOOGLE_CLOUD_PROJECT")


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


def check_default_run(tmp_path: Path, out: dict, browser) -> None:
    """What a run of the default scenario (a PyTorch job of examples/workdir over three zones, preempted twice, the
    first zone stocking out after the first) must show, whoever wrote the job file."""
    job = out["job_id"]
    # The page `respawn jobs report` writes, from what the control plane recorded, in a real browser; its
    # screenshot is kept (test-artifacts/). Its buckets cover the job's time: registration to its end.
    buckets = out["goodput_buckets"]
    assert set(buckets) == set(BUCKETS) and buckets["productive_training"] > 0
    assert abs(sum(buckets.values()) - out["wall_seconds"]) < 1.0
    page, errors = open_page(browser, Path(out["report"]), screenshot="report-default-demo.png")
    assert errors == []
    assert [page.locator("rect.life").nth(i).get_attribute("data-node") for i in range(3)] == [
        f"{job}-1", f"{job}-2", f"{job}-2"]  # moved once, then restarted in place
    summary = dict(zip(page.locator("table.summary th").all_inner_texts(),
                       page.locator("table.summary td").all_inner_texts()))
    assert summary["state"] == "SUCCEEDED" and summary["lives"] == "3"
    assert summary["cost"].startswith("$") and "(on demand $" in summary["cost"]  # the controller's ledger
    # Its headline, from the same record: the job's steps, preemptions, the recovered events' figures, the ledger.
    headline = {f.get_attribute("data-figure"): f.locator(".value").inner_text()
                for f in page.locator(".headline .figure").all()}
    assert (headline["state"], headline["steps"], headline["preemptions"], headline["steps_lost"]) == (
        "succeeded", f"{out['final_step']} of {out['total_steps']}", "2", "0")
    assert headline["recoveries"] == ", ".join(f"{x:.1f} s" for x in out["recovery_seconds"])
    assert out["cost"].startswith(headline["cost"].removesuffix(")") + ";"), (headline["cost"], out["cost"])
    assert out["restarts"] == 2 and out["lost_steps"] == 0
    # The preempted first node's logs, read back by `respawn jobs logs` after its replacement ran (docs/watching.md):
    # its setup's output and the trainer's last words, said during the notice, each line naming its node.
    said = (tmp_path / "out" / "logs.txt").read_text().splitlines()
    first = [line for line in said if line.startswith(f"[{job}-1] ")]
    assert any("prepare.py: " in line for line in first) and any("preempted at step" in line for line in first), first[-5:]
    assert [row.split(":")[0] for row in out["logs"][:2]] == [f"{job}-1", f"{job}-2"], out["logs"]
    # Each preemption's recovery, from its notice to every rank stepping again: the same figure in the summary, the
    # events, Slack, describe and the report page (check_common); nothing lost, the emergency save committed before
    # the resume (the figure is taken after it).
    told = check_recoveries(out)
    assert len(out["recovery_seconds"]) == 2 and all(x > 0 for x in out["recovery_seconds"])
    assert [d["steps_lost"] for d in told] == [0, 0] and [d["loss_cause"] for d in told] == ["preempted"] * 2
    shown = page.content()
    for x in out["recovery_seconds"]:
        assert f"{x:.1f} s after the notice (recovery time)" in shown
    # The same preemption is told with the same cause, however the controller heard of it first.
    losses = [t for t in out["transitions"] if t["details"].get("lost")]
    assert [t["cause"] for t in losses] == ["preempted", "preempted"], losses
    # The first zone stocked out after the first preemption: the job moved down its list.
    assert out["zones"][:2] == ["us-central1-a", "us-central1-b"]
    assert sum("recovered" in a for a in out["alerts"]) == 2
    # The real path: every node booted deploy/vm/startup.sh, which fetched the agent from the storage emulator; the
    # agent fetched the packed examples/workdir from it and ran the setup command and the trainer on the spec's
    # interpreter; the restart in place (the second preemption) reused both and skipped setup.
    logs = {p.name.split(".")[0]: [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
            for p in (tmp_path / "out" / "nodes").rglob("*.console.log")}
    assert len(logs) == 2, sorted(logs)
    for node, lines in logs.items():
        fetches = [e for e in lines if e.get("stage") == "agent_fetch"]
        assert fetches[0]["downloaded"] is True and fetches[0]["uri"].startswith("gs://respawn-demo/"), node
        stages = [e for e in lines if e["message"] == "prepare stage"]
        downloads = [e for e in stages if e["stage"] == "workdir_download"]
        assert len(downloads) == 1 and downloads[0]["uri"].startswith("gs://respawn-demo/respawn/workdirs/sha256-")
        [setup] = [e for e in stages if e["stage"] == "setup_command"]
        assert setup["argv"] == [sys.executable, "prepare.py", "--framework", "torch"] and setup["exit_code"] == 0
    boots = {node: [e["downloaded"] for e in lines if e.get("stage") == "agent_fetch"] for node, lines in logs.items()}
    assert sorted(boots.values()) == [[True], [True, False]], boots
    restarted = next(logs[node] for node, fetched in boots.items() if len(fetched) == 2)
    assert any(e.get("stage") == "workdir_reuse" for e in restarted)
    assert any(e.get("stage") == "setup" and e.get("skipped") for e in restarted)
