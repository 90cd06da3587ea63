"""One record, every page (issue 46): what a finished demo run shows a user, read back from what it wrote — the
summary, the report page (report.html, parsed as text: no browser), `respawn jobs describe` (describe.txt, the table
the demo had the CLI print; or --json's figures where a test ran it) and the Slack messages the demo captured — must
agree on every figure each shows: goodput and its buckets, steps lost, each recovery's time and notice, the cost and
the share saved, the trainer's last error. Each page is parsed on its own; none is computed here from the record."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from respawn.control.goodput import BUCKETS


@dataclass
class Page:
    """The report page's figures as it shows them: the headline (data-figure → value) and its tables' rows."""

    headline: dict[str, str] = field(default_factory=dict)
    tables: dict[str, list[list[str]]] = field(default_factory=dict)  # class → rows of cell texts (no header)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self.figure: str | None = None
        self.in_value = False
        self.table: str | None = None
        self.cell: list[str] | None = None
        self.row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and a.get("data-figure"):
            self.figure = a["data-figure"]
        elif tag == "div" and a.get("class") == "value" and self.figure:
            self.in_value = True
            self.page.headline[self.figure] = ""
        elif tag == "table":
            self.table = a.get("class") or ""
            self.page.tables[self.table] = []
        elif tag == "tr" and self.table is not None:
            self.row = []
        elif tag == "td" and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "div" and self.in_value:
            self.in_value, self.figure = False, None
        elif tag == "td" and self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr" and self.row is not None and self.table is not None:
            if self.row:  # a header row has no td
                self.page.tables[self.table].append(self.row)
            self.row = None
        elif tag == "table":
            self.table = None

    def handle_data(self, data):
        if self.in_value and self.figure:
            self.page.headline[self.figure] += data
        elif self.cell is not None:
            self.cell.append(data)


def report_page(path: Path) -> Page:
    reader = _Reader()
    reader.feed(path.read_text())
    return reader.page


@dataclass
class Described:
    """`respawn jobs describe`'s table for a person: its facts (name → value), its losses' rows, its goodput."""

    facts: dict[str, str]
    losses: list[list[str]]
    goodput: str | None  # the buckets table's title: "goodput 50.7% of 40.2 s"
    buckets: list[list[str]]


def described(text: str) -> Described:
    lines = text.splitlines()
    facts: dict[str, str] = {}
    tables: dict[str, list[list[str]]] = {"losses": [], "buckets": []}
    goodput, into = None, None
    for line in lines[1:]:  # the first: "job NAME"
        if line.startswith("losses and recoveries"):
            into = "losses"
        elif line.startswith("goodput ") and " of " in line:
            into, goodput = "buckets", line.strip()
        elif into is None and re.match(r"^\S", line):
            m = re.match(r"^(\S.*?)\s{2,}(.*?)\s*$", line)
            if m:
                facts[m.group(1)] = m.group(2)
        elif into and line.startswith("│"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            if cells[0]:  # a wrapped cell's next line leaves the first cells empty
                tables[into].append(cells)
    return Described(facts, tables["losses"], goodput, tables["buckets"])


def _secs(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def assert_pages_agree(out_dir: Path, summary: dict, figures: dict | None = None) -> None:
    """The summary (`respawn demo --json`), report.html, describe.txt (and describe --json's `figures`, when given)
    and the captured Slack alerts of one finished demo run show the same figures."""
    page = report_page(out_dir / "report.html")
    h = page.headline
    d = described((out_dir / "describe.txt").read_text())
    s = summary

    # Goodput, and its buckets (seconds, in one order: ml-goodput-measurement's keys, the page's words).
    shown = f"{s['goodput']:.1%}"
    assert h["goodput"] == d.facts["goodput"] == shown, (h["goodput"], d.facts["goodput"], shown)
    assert d.goodput is not None and d.goodput.startswith(f"goodput {shown} of "), d.goodput
    seconds = [_secs(s["goodput_buckets"][k]) for k in BUCKETS]
    assert [r[1] for r in page.tables["goodput"]] == [r[1] for r in d.buckets] == seconds, (page.tables["goodput"],
                                                                                             d.buckets, seconds)
    assert [r[0] for r in page.tables["goodput"]] == [r[0] for r in d.buckets]  # one vocabulary

    # Steps lost: the total, and each recovery's.
    lost = "unknown" if s["lost_steps"] is None else str(s["lost_steps"])
    assert h["steps_lost"] == d.facts["steps lost"] == lost, (h["steps_lost"], d.facts["steps lost"], lost)

    # Each loss: when (its notice, for a preemption), its recovery time, its steps lost — page and describe alike.
    rows = page.tables.get("recoveries", [])
    assert [r[:3] for r in rows] == [r[:3] for r in d.losses], (rows, d.losses)
    assert [r[3].split(" (")[0] for r in rows] == [r[3] for r in d.losses], (rows, d.losses)
    assert [r[4] for r in rows] == [r[4] for r in d.losses], (rows, d.losses)
    recovered = [r for r in rows if re.fullmatch(r"[\d.]+ s", r[3].split(" (")[0])]
    assert [r[3].split(" (")[0] for r in recovered] == [_secs(x) for x in s["recovery_seconds"]], (
        rows, s["recovery_seconds"])
    assert h["recoveries"].split(", ")[:len(recovered)] == [_secs(x) for x in s["recovery_seconds"]] or (
        not recovered and not s["recovery_seconds"]), (h["recoveries"], s["recovery_seconds"])
    noticed = [r[0] for r in rows if r[1].startswith(("preempted ", "run ended "))]
    assert noticed == [f"{x:.1f} s" for x in s.get("notice_seconds") or []], (noticed, s.get("notice_seconds"))

    # Slack: every alert that tells a recovery says its time and steps lost as the pages do.
    told = [(m[1], m[2]) for a in s["alerts"] if (m := re.search(r"recovery time: ([\d.]+ s); steps lost: (\w+)", a))]
    assert sorted(told) == sorted((r[3].split(" (")[0], r[4]) for r in recovered), (told, recovered)

    # Cost and the share saved against on demand.
    if "cost" in h:
        assert d.facts["cost"] == h["cost"] and s["cost"].startswith(h["cost"].removesuffix(")") + ";"), (
            h["cost"], d.facts["cost"], s["cost"])
        # The job's last word (Slack delivers in no set order: a `recovered` may arrive after `succeeded`).
        last = [a for a in s["alerts"] if "cost so far: " in a
                and re.match(r"Job \S+ (succeeded|failed|reached its budget)", a)]
        if last and s["state"] in ("SUCCEEDED", "FAILED", "BUDGET_EXHAUSTED", "CANCELLED"):
            assert re.search(r"cost so far: (\$[\d.]+) \(on demand: (\$[\d.]+)\)", last[-1]).groups() == re.match(
                r"(\$[\d.]+) \(on demand (\$[\d.]+)\)", h["cost"]).groups(), (last[-1], h["cost"])
    if "saved" in h:
        assert d.facts["saved vs on demand"] == h["saved"] and s["cost"].endswith(
            f"; saved against on demand: {h['saved']}"), (h["saved"], d.facts.get("saved vs on demand"), s["cost"])

    # The trainer's last error, where there was one.
    if s.get("last_error") or "last_error" in h:
        assert h["last_error"] == d.facts["last error"] == s["last_error"], (h.get("last_error"), s.get("last_error"))
        assert any(f"last error: {s['last_error']}" in a for a in s["alerts"]), s["alerts"]

    if figures is not None:  # describe --json: the figures the pages render
        assert (figures["goodput"], figures["steps_lost"], figures["recovery_seconds"]) == (
            s["goodput"], s["lost_steps"], s["recovery_seconds"])
