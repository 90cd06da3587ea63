"""The timeline picture of a job: one self-contained HTML file with an inline SVG, no network needed to view it.
Drawn for the demo (sim/demo: from the heartbeats it sampled) and for a real job (respawn/report.py: from its
events and its nodes' heartbeats, `respawn jobs report`).

Rows are zones; bars are node lifetimes; red marks are preemption notices, purple ones the moment the job steps
again after each (its notice-to-step time in the mark's tip and the summary); the bottom panel is training progress
(steps over time, one line per trainer life) with its checkpoints; grey bands are downtime, when no node was
training.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass
class NodeSpan:
    name: str
    zone: str
    start: float
    end: float
    end_reason: str = ""  # preempted, host-error, deleted, running
    workers: int = 1  # hosts of a multi-host TPU slice that heartbeat
    model: str = ""  # its provisioning model (spot, flex-start, standard): the bar's colour
    slot: int | None = None  # a member slot of a job of several nodes


@dataclass
class Mark:
    t: float
    kind: str  # notice, checkpoint, emergency, restart, training again (the job steps again after a notice)
    label: str = ""
    zone: str | None = None


@dataclass
class Timeline:
    title: str
    wall_seconds: float
    zones: list[str]
    nodes: list[NodeSpan] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    downtime: list[tuple[float, float]] = field(default_factory=list)
    progress: list[list[tuple[float, int]]] = field(default_factory=list)  # per trainer life: (t, step)
    total_steps: int = 0
    summary: dict = field(default_factory=dict)


_W, _LEFT, _ROW, _TOP, _PROGRESS = 1000, 130, 34, 40, 150
# Bars by provisioning model (Spot, and unknown, the default blue).
_MODEL_FILL = {"flex-start": ("#c7e9c0", "#31a354"), "standard": ("#d9d9d9", "#636363"),
               "preemptible": ("#dadaeb", "#756bb1")}
_COLOURS = {"notice": "#d62728", "checkpoint": "#2ca02c", "emergency": "#ff7f0e", "restart": "#1f77b4",
            "training again": "#9467bd"}


def render_html(tl: Timeline, tables: list[tuple[str, list[str], list[list[str]]]] = ()) -> str:
    """The page; `tables`: more (title, header, rows) after the summary (a report's events)."""
    span = max(tl.wall_seconds, 1e-6)
    x = lambda t: _LEFT + (_W - _LEFT - 20) * max(0.0, min(t, span)) / span  # noqa: E731
    zones_h = _ROW * len(tl.zones)
    height = _TOP + zones_h + 30 + _PROGRESS + 50
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" font-family="sans-serif" font-size="12">']
    for t0, t1 in tl.downtime:
        svg.append(f'<rect x="{x(t0):.1f}" y="{_TOP - 10}" width="{max(1.0, x(t1) - x(t0)):.1f}" '
                   f'height="{zones_h + 40 + _PROGRESS}" fill="#eeeeee"><title>downtime {t1 - t0:.1f} s</title></rect>')
    for i, zone in enumerate(tl.zones):
        y = _TOP + i * _ROW
        svg.append(f'<text x="8" y="{y + _ROW / 2 + 4}">{html.escape(zone)}</text>')
        svg.append(f'<line x1="{_LEFT}" y1="{y + _ROW}" x2="{_W - 20}" y2="{y + _ROW}" stroke="#dddddd"/>')
    for n in tl.nodes:
        if n.zone not in tl.zones:
            continue
        y = _TOP + tl.zones.index(n.zone) * _ROW + 6
        w = max(2.0, x(n.end) - x(n.start))
        hosts = f", {n.workers} workers" if n.workers > 1 else ""
        model = f"{n.model}, " if n.model else ""
        tip = f"{n.name}: {n.start:.1f}–{n.end:.1f} s ({model}{n.end_reason or 'running'}{hosts})"
        fill, stroke = _MODEL_FILL.get(n.model, ("#9ecae1", "#3182bd"))
        svg.append(f'<rect class="life" data-node="{html.escape(n.name)}" data-model="{html.escape(n.model)}" '
                   f'x="{x(n.start):.1f}" y="{y}" width="{w:.1f}" height="{_ROW - 12}" rx="3" fill="{fill}" '
                   f'stroke="{stroke}"><title>{html.escape(tip)}</title></rect>')
        label = n.name + (f" ×{n.workers} workers" if n.workers > 1 else "")
        svg.append(f'<text x="{x(n.start) + 4:.1f}" y="{y + _ROW / 2}">{html.escape(label)}</text>')
    py0 = _TOP + zones_h + 30
    svg.append(f'<text x="8" y="{py0 + _PROGRESS / 2}">step</text>')
    svg.append(f'<rect x="{_LEFT}" y="{py0}" width="{_W - 20 - _LEFT}" height="{_PROGRESS}" fill="none" stroke="#cccccc"/>')
    top_step = max([s for points in tl.progress for _, s in points] + [tl.total_steps, 1])
    yv = lambda s: py0 + _PROGRESS - _PROGRESS * s / top_step  # noqa: E731
    for k in range(5):  # the step axis: 0, a quarter, … the top
        s = round(top_step * k / 4)
        svg.append(f'<text x="{_LEFT - 8}" y="{yv(s) + 4:.1f}" text-anchor="end">{s}</text>')
        svg.append(f'<line x1="{_LEFT}" y1="{yv(s):.1f}" x2="{_W - 20}" y2="{yv(s):.1f}" stroke="#f0f0f0"/>')
    for i, points in enumerate(tl.progress):
        if points:
            pts = " ".join(f"{x(t):.1f},{yv(s):.1f}" for t, s in points)
            svg.append(f'<polyline class="progress" data-life="{i}" points="{pts}" fill="none" stroke="#555555" '
                       f'stroke-width="1.5"><title>life {i + 1}: steps {points[0][1]}–{points[-1][1]}</title></polyline>')
    for m in tl.marks:
        colour = _COLOURS.get(m.kind, "#555555")
        tip = html.escape(f"{m.kind} at {m.t:.1f} s {m.label}".strip())
        if m.kind in ("checkpoint", "emergency"):
            svg.append(f'<circle cx="{x(m.t):.1f}" cy="{py0 + _PROGRESS + 8}" r="4" fill="{colour}"><title>{tip}</title></circle>')
        else:
            svg.append(f'<line x1="{x(m.t):.1f}" y1="{_TOP - 10}" x2="{x(m.t):.1f}" y2="{py0 + _PROGRESS}" '
                       f'stroke="{colour}" stroke-dasharray="4,3"><title>{tip}</title></line>')
    for k in range(6):
        t = span * k / 5
        svg.append(f'<text x="{x(t) - 10:.1f}" y="{height - 12}">{t:.0f} s</text>')
    svg.append("</svg>")
    legend = " · ".join(f'<span style="color:{c}">■</span> {k}' for k, c in _COLOURS.items())
    if any(n.model for n in tl.nodes):
        legend += " · bars: " + " · ".join(f'<span style="color:{s}">■</span> {m}' for m, (_, s) in
                                          {"spot": ("", "#3182bd"), **_MODEL_FILL}.items())
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in tl.summary.items())
    more = "".join(
        f"<h3>{html.escape(title)}</h3><table class='{html.escape(title)}'><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in body)
        + "</table>" for title, header, body in tables)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(tl.title)}</title>"
        "<style>body{font-family:sans-serif;margin:20px}th{text-align:left;padding-right:12px}"
        "td{padding-right:12px;vertical-align:top}</style></head><body>"
        f"<h2>{html.escape(tl.title)}</h2>{''.join(svg)}"
        f"<p>{legend} · <span style='color:#bbbbbb'>■</span> downtime · bars: node lifetimes per zone</p>"
        f"<table class='summary'>{rows}</table>{more}</body></html>"
    )
