"""The timeline picture of a job: one self-contained HTML file with an inline SVG, no network needed to view it.
Drawn for the demo (sim/demo: from the heartbeats it sampled) and for a real job (respawn/app/report.py: from its
events and its nodes' heartbeats, `respawn jobs report`).

Above the chart, a headline of the figures a user asks first (a report's: respawn.app.report.headline). Rows are
zones; bars are node lifetimes; red marks are preemption notices, brown ones crashes (no notice came), purple ones the moment the job steps again after
each, with the recovery time between them over the chart; the bottom panel is training progress (steps over time,
one line per trainer life) with its checkpoints (green dots) and emergency saves (orange diamonds on the step line,
labelled, drawn over the rest); grey bands are downtime, when no node was training. The legend names only what is
drawn; the times of the axis are seconds since the chart's 0.
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
    kind: str  # notice, crash, checkpoint, emergency, restart, training again (the job steps again after a loss)
    label: str = ""
    zone: str | None = None
    step: int | None = None  # a checkpoint's or an emergency save's step: drawn on the step line


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
    headline: list[tuple[str, str, str]] = field(default_factory=list)  # (key, label, value), above the chart
    recoveries: list[tuple[float, float, str]] = field(default_factory=list)  # (notice, stepping again, its time)


_W, _LEFT, _ROW, _TOP, _PROGRESS = 1000, 130, 34, 50, 150
# Bars by provisioning model (Spot, and unknown, the default blue).
_MODEL_FILL = {"flex-start": ("#c7e9c0", "#31a354"), "standard": ("#d9d9d9", "#636363"),
               "preemptible": ("#dadaeb", "#756bb1")}
_COLOURS = {"notice": "#d62728", "crash": "#8c564b", "checkpoint": "#2ca02c", "emergency": "#ff7f0e",
            "restart": "#1f77b4", "training again": "#9467bd"}
_LEGEND = {"notice": "notice", "crash": "crash (the job's own failure: no notice)", "checkpoint": "checkpoint",
           "emergency": "emergency save", "restart": "restart", "training again": "every rank stepping again"}


def _plain(value: object) -> str:
    """A value in words, not a repr: a list joined by commas, a mapping as 'key: value; …'."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value)
    return str(value)


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
    order = {"checkpoint": 0, "emergency": 2}  # an emergency save is drawn over every other mark
    labelled: set[int | None] = set()  # an emergency save's step, labelled once (a demo sees some twice)
    for m in sorted(tl.marks, key=lambda m: order.get(m.kind, 1)):
        colour = _COLOURS.get(m.kind, "#555555")
        tip = html.escape(f"{m.kind} at {m.t:.1f} s {m.label}".strip())
        if m.kind == "emergency":
            cx, cy = x(m.t), (yv(m.step) if m.step is not None else py0 + _PROGRESS + 8)
            svg.append(f'<path class="mark emergency" d="M{cx:.1f},{cy - 8:.1f} l8,8 l-8,8 l-8,-8 z" fill="{colour}" '
                       f'stroke="#ffffff"><title>{tip}</title></path>')
            if m.step not in labelled:
                labelled.add(m.step)
                svg.append(f'<text x="{cx + 10:.1f}" y="{cy - 6:.1f}" fill="{colour}" font-weight="bold" '
                           f'stroke="#ffffff" stroke-width="3" paint-order="stroke">emergency '
                           f'save{"" if m.step is None else f" {m.step}"}</text>')
        elif m.kind == "checkpoint":
            svg.append(f'<circle class="mark checkpoint" cx="{x(m.t):.1f}" cy="{py0 + _PROGRESS + 8}" r="4" '
                       f'fill="{colour}"><title>{tip}</title></circle>')
        else:
            svg.append(f'<line class="mark {html.escape(m.kind.replace(" ", "-"))}" x1="{x(m.t):.1f}" y1="{_TOP - 10}" '
                       f'x2="{x(m.t):.1f}" y2="{py0 + _PROGRESS}" stroke="{colour}" stroke-dasharray="4,3">'
                       f'<title>{tip}</title></line>')
    for t0, t1, said in tl.recoveries:  # the recovery time, over the chart, from its notice to stepping again
        y = _TOP - 18
        svg.append(f'<line class="recovery" x1="{x(t0):.1f}" y1="{y}" x2="{x(t1):.1f}" y2="{y}" stroke="#9467bd" '
                   f'stroke-width="2"/><text x="{(x(t0) + x(t1)) / 2:.1f}" y="{y - 5}" text-anchor="middle" '
                   f'fill="#9467bd">recovery {html.escape(said)}</text>')
    for k in range(6):
        t = span * k / 5
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"
        svg.append(f'<text x="{x(t):.1f}" y="{height - 12}" text-anchor="{anchor}">{t:.0f} s</text>')
    svg.append("</svg>")
    drawn = [k for k in _LEGEND if any(m.kind == k for m in tl.marks)]
    legend = [f'<span style="color:{_COLOURS[k]}">{"◆" if k == "emergency" else "■"}</span> {_LEGEND[k]}' for k in drawn]
    if tl.recoveries:
        legend.append('<span style="color:#9467bd">━</span> recovery time')
    if tl.progress:
        legend.append('<span style="color:#555555">━</span> steps of each run')
    if tl.downtime:
        legend.append("<span style='color:#bbbbbb'>■</span> downtime")
    models = list(dict.fromkeys(n.model for n in tl.nodes if n.zone in tl.zones))
    bars = [f'<span style="color:{_MODEL_FILL.get(m, ("", "#3182bd"))[1]}">■</span> {html.escape(m or "node")}'
            for m in models]
    legend.append("bars, node lives per zone: " + " · ".join(bars) if bars else "")
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_plain(v))}</td></tr>" for k, v in tl.summary.items())
    head = "".join(f"<div class='figure' data-figure='{html.escape(key)}'><div class='value'>{html.escape(value)}</div>"
                   f"<div class='label'>{html.escape(label)}</div></div>" for key, label, value in tl.headline)
    more = "".join(
        f"<h3>{html.escape(title)}</h3><table class='{html.escape(title)}'><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in body)
        + "</table>" for title, header, body in tables)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(tl.title)}</title>"
        "<style>body{font-family:sans-serif;margin:20px}th{text-align:left;padding-right:12px}"
        "td{padding-right:12px;vertical-align:top}td:not(:last-child){white-space:nowrap}"
        "table.recoveries td:nth-child(4),table.recoveries td:nth-child(n+6){white-space:normal;max-width:380px}"
        ".headline{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0 4px}"
        ".figure{border:1px solid #dddddd;border-radius:4px;padding:6px 10px;min-width:120px;max-width:300px}"
        ".figure .value{font-size:20px;font-weight:bold}.figure .label{font-size:12px;color:#555555}"
        "</style></head><body>"
        f"<h2>{html.escape(tl.title)}</h2>"
        + (f"<section class='headline'>{head}</section>" if head else "")
        + f"{''.join(svg)}<p class='legend'>{' · '.join(part for part in legend if part)} · time: seconds since the chart's 0</p>"
        f"<table class='summary'>{rows}</table>{more}</body></html>"
    )
