"""The demo's live view: a terminal panel of job state, zone, node, step and recent events (rich), or one plain
line per change when the output is not a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from sim.demo.runner import Progress


def _panel(p: Progress) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    step = "-" if p.step is None else f"{p.step}/{p.total_steps or '?'}"
    rows = [("job", p.job_id), ("state", p.state), ("zone", p.zone or "-"), ("node", p.node or "-"),
            ("step", step), ("committed", "-" if p.committed is None else str(p.committed)),
            ("restarts", str(p.restarts)), ("live nodes", str(p.live_nodes)), ("Slack alerts", str(p.alerts))]
    if len(p.workers) > 1:  # a multi-host TPU slice: each worker's agent beats on its own
        rows.insert(5, ("workers", "  ".join(f"w{w} {state} {'-' if step is None else step}"
                                              for w, state, step in p.workers)))
    if p.members:  # a job of several nodes (DemoRun lists the slots then): every member slot's node
        rows.insert(5, ("members", "  ".join(f"{slot}:{node} {state} {'-' if step is None else step}"
                                              for slot, node, state, step in p.members)))
    for k, v in rows:
        grid.add_row(k, v)
    events = Table.grid()
    for line in p.events[-8:]:
        events.add_row(line)
    return Panel(Group(grid, Panel(events, title="events")), title=f"respawn demo: {p.scenario}  t={p.t:5.1f}s")


class LiveView:
    def __init__(self, enabled: bool, stream: TextIO = sys.stderr):
        self.console = Console(file=stream)
        self.enabled = enabled and self.console.is_terminal
        self._live: Live | None = None
        self._last: tuple | None = None
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
        if self._live is not None:
            self._live.update(_panel(p))
            return
        key = (p.state, p.node, p.zone, p.live_nodes, (p.step or 0) // 50, tuple(w[:2] for w in p.workers),
               tuple(m[:3] for m in p.members))
        if key != self._last:
            self._last = key
            print(f"[{p.t:6.1f}s] {p.state:<20} zone={p.zone or '-'} node={p.node or '-'} step={p.step if p.step is not None else '-'}"
                  f"/{p.total_steps or '?'} committed={p.committed if p.committed is not None else '-'} live={p.live_nodes}"
                  + (" workers=" + ",".join(f"w{w}:{state}" for w, state, _ in p.workers) if len(p.workers) > 1 else "")
                  + (" members=" + ",".join(f"{node}:{state}" for _, node, state, _ in p.members) if p.members else ""),
                  file=self._stream, flush=True)

    def say(self, message: str) -> None:
        if self._live is not None:
            self._live.console.print(f"[dim]{message}[/dim]", highlight=False)
        else:
            print(f"demo: {message}", file=self._stream, flush=True)
