"""The demo's live view: a terminal panel of job state, zone, node, step and recent events (rich), or one plain
line per change when the output is not a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sim.demo.runner import Progress


def _step_and_committed(p: Progress, known: tuple[int | None, int | None]) -> tuple[str, str]:
    """The step and committed step to show: while no node reports them (a recovery), the last known ones marked
    "recovering", so that the gap does not read as lost progress; "-" before the first report."""
    step, committed = p.step, p.committed
    recovering = step is None and known[0] is not None
    if recovering:
        step, committed = known
    shown = "-" if step is None else f"{step}/{p.total_steps or '?'}" + (" (recovering)" if recovering else "")
    return shown, "-" if committed is None else str(committed)


def _panel(p: Progress, known: tuple[int | None, int | None] = (None, None)) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    step, committed = _step_and_committed(p, known)
    rows = [("job", p.job_id), ("state", p.state), ("zone", p.zone or "-"), ("node", p.node or "-"),
            ("step", step), ("committed", committed),
            ("restarts", str(p.restarts)), ("live nodes", str(p.live_nodes)), ("Slack alerts", str(p.alerts))]
    if len(p.workers) > 1:  # a multi-host TPU slice: each worker's agent beats on its own
        rows.insert(5, ("workers", "  ".join(f"w{w} {state} {'-' if step is None else step}"
                                              for w, state, step in p.workers)))
    if p.members:  # a job of several nodes (DemoRun lists the slots then): every member slot's node
        rows.insert(5, ("members", "  ".join(f"{slot}:{node} {state} {'-' if step is None else step}"
                                              for slot, node, state, step in p.members)))
    for k, v in rows:
        grid.add_row(k, Text(v))
    events = Table.grid()
    for line in p.events[-8:]:
        events.add_row(Text(line))  # as written: an event's details may hold [...]
    return Panel(Group(grid, Panel(events, title="events")), title=f"respawn demo: {p.scenario}  t={p.t:5.1f}s")


class LiveView:
    def __init__(self, enabled: bool, stream: TextIO = sys.stderr):
        self.console = Console(file=stream)
        self.enabled = enabled and self.console.is_terminal
        self._live: Live | None = None
        self._last: tuple | None = None
        self._known: tuple[int | None, int | None] = (None, None)  # the last step and committed step reported
        self._stream = stream

    def __enter__(self) -> "LiveView":
        if self.enabled:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, p: Progress) -> None:
        if p.step is not None:
            self._known = (p.step, p.committed if p.committed is not None else self._known[1])
        if self._live is not None:
            self._live.update(_panel(p, self._known))
            return
        key = (p.state, p.node, p.zone, p.live_nodes, (p.step or 0) // 50, tuple(w[:2] for w in p.workers),
               tuple(m[:3] for m in p.members))
        if key != self._last:
            self._last = key
            step, committed = _step_and_committed(p, self._known)
            print(f"[{p.t:6.1f}s] {p.state:<20} zone={p.zone or '-'} node={p.node or '-'} step={step} "
                  f"committed={committed} live={p.live_nodes}"
                  + (" workers=" + ",".join(f"w{w}:{state}" for w, state, _ in p.workers) if len(p.workers) > 1 else "")
                  + (" members=" + ",".join(f"{node}:{state}" for _, node, state, _ in p.members) if p.members else ""),
                  file=self._stream, flush=True)

    def say(self, message: str) -> None:
        if self._live is not None:
            self._live.console.print(Text(message, style="dim"), highlight=False)
        else:
            print(f"demo: {message}", file=self._stream, flush=True)
