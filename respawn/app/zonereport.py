"""`respawn zones`: what is known of one machine shape in some zones, each from where it lives (the CLI's adapter;
docs/gcp-facts.md §20, §21): the regional quotas (regions.get), the capacity advice (advice.capacity) and its history
(advice.capacityHistory) through respawn.app.compute_read with the user's credentials, and what Respawn's controller saw
there (capacity/{zone}~{accelerator} in Firestore, read by the caller). A source that cannot be read leaves its
columns empty and says why once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from respawn import advice, prices
from respawn.schema import STATS, ZoneStats

from .compute_read import Answer, Reader


@dataclass
class ZoneRow:
    zone: str
    quotas: dict[str, advice.Quota] = field(default_factory=dict)  # metric → Quota (Spot's and on-demand's)
    scores: advice.ZoneAdvice | None = None
    history: advice.History | None = None
    stats: dict[str, ZoneStats] = field(default_factory=dict)  # provisioning model → what Respawn saw
    cooling_until: datetime | None = None  # a refusal's cooldown, for every job
    seen_read: bool = False  # whether the controller's records could be read


@dataclass
class Report:
    rows: list[ZoneRow]
    notes: list[str] = field(default_factory=list)  # one per source that could not be read


def _why(answer: Answer) -> str:
    if answer.status is None:
        return answer.problem
    return f"HTTP {answer.status}" + (f": {answer.message}" if answer.message else "")


def region_zones(look: Reader, region: str) -> list[str] | str:
    """The zones of `region` (regions.get), or why they could not be read."""
    answer = look.get(f"projects/{look.project}/regions/{region}")
    if answer.status != 200:
        return _why(answer)
    return sorted(advice.zone_name(z) for z in answer.body.get("zones") or [])


def report(look: Reader, shape: advice.Shape, zones: list[str], size: int = 1) -> Report:
    """Quotas, advice scores and history for each zone; the first failure of each source becomes a note."""
    rows = [ZoneRow(z) for z in zones]
    notes: dict[str, str] = {}
    metrics = [advice.quota_metric(shape.gpu, m) for m in ("spot", "standard")]
    for region in dict.fromkeys(advice.region_of(z) for z in zones):
        answer = look.get(f"projects/{look.project}/regions/{region}")
        quotas = advice.parse_quotas(answer.body) if answer.status == 200 else None
        if quotas is None:
            notes.setdefault("quotas", f"quotas: {_why(answer) if answer.status != 200 else 'not given'}")
            continue
        for row in rows:
            if advice.region_of(row.zone) == region:
                row.quotas = {m: quotas[m] for m in metrics if m and m in quotas}
    for row in rows:
        path = f"projects/{look.project}/regions/{advice.region_of(row.zone)}/advice"
        if "advice" not in notes:
            answer = look.post(f"{path}/capacity", advice.capacity_request(shape, row.zone, size))
            if answer.status == 200:
                row.scores = advice.parse_capacity(answer.body, row.zone)
            else:
                notes["advice"] = f"capacity advice: {_why(answer)}"
        if "history" not in notes:
            answer = look.post(f"{path}/capacityHistory", advice.history_request(shape, row.zone))
            if answer.status == 200:
                row.history = advice.parse_history(answer.body)
            else:
                notes["history"] = f"capacity history: {_why(answer)}"
    return Report(rows, list(notes.values()))


def _offline_rate(shape: advice.Shape, region: str) -> Any:
    """The VM's Spot rate in `region` from respawn/prices.py's dated offline table (without a boot disk, as Compute
    Engine's Spot price is), or None where the table cannot price it."""
    book = prices.offline(region)
    node = prices.shape_of(SimpleNamespace(kind="gpu", machine_type=shape.machine_type, boot_disk_gb=0,
                                           accelerator_type=shape.accelerator_type,
                                           accelerator_count=shape.accelerator_count))
    return prices.rate(node, "spot", book) if book and node else None


def offline_price(shape: advice.Shape, region: str) -> str | None:
    """The VM's Spot and on-demand price an hour in `region` from the dated offline table, or None."""
    found = _offline_rate(shape, region)
    if found is None:
        return None
    return (f"Spot {prices.usd(found.usd_per_hour)}/h, on demand {prices.usd(found.on_demand_usd_per_hour)}/h "
            f"({found.note})")


def offline_spot(shape: advice.Shape, zone: str) -> str | None:
    """The Spot price column's cell where Compute Engine gave none: the offline table's, marked as such."""
    found = _offline_rate(shape, advice.region_of(zone))
    return None if found is None else f"{prices.usd(found.usd_per_hour)}/h (offline table)"


def add_seen(rows: list[ZoneRow], records: dict[str, dict[str, Any]]) -> None:
    """Fill each row with what the controller recorded there (JobStore.capacity_records)."""
    for row in rows:
        doc = records.get(row.zone) or {}
        row.stats = {m: ZoneStats.model_validate(v) for m, v in (doc.get(STATS) or {}).items()}
        until = doc.get("until")
        row.cooling_until = until if isinstance(until, datetime) else None
        row.seen_read = True
