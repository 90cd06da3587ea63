"""What a job has cost so far, read from its status's ledger (schema.CostLedger: the closed lives; each member's
BilledLife: its open life). Pure. The control plane books the lives and stops a job at its budget
(respawn.control.costs); the CLI, its report and the demo read the figure here, below both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .schema import JobStatus


def hours(since: datetime, now: datetime) -> float:
    """A life's hours from `since` to `now` (none before it began)."""
    return max((now - since).total_seconds(), 0.0) / 3600


def spent(s: JobStatus, now: datetime) -> tuple[float, float]:
    """(USD so far, the same lives priced on demand): the closed lives and each open life to `now`."""
    usd, on_demand = s.cost.closed_usd, s.cost.closed_on_demand_usd
    for m in s.members:
        if m.billing is not None:
            h = hours(m.billing.since, now)
            usd += h * m.billing.usd_per_hour
            on_demand += h * m.billing.on_demand_usd_per_hour
    return usd, on_demand


def summary(s: JobStatus, now: datetime, cap: float | None = None) -> dict[str, Any]:
    """The cost so far as `respawn jobs describe` and the demo show it: against the same lives on demand, which
    prices were used (or why a life is unpriced), and the budget's share."""
    usd, on_demand = spent(s, now)
    ran = s.cost.closed_usd > 0 or any(m.running_at is not None or m.billing is not None for m in s.members)
    prices = s.cost.note or ("no prices" if s.cost.unpriced else "not priced yet" if ran else
                             "none yet (no node has run)")
    out: dict[str, Any] = {"so_far_usd": round(usd, 4), "on_demand_usd": round(on_demand, 4), "prices": prices}
    if s.cost.unpriced:
        out["unpriced"] = s.cost.unpriced
    if cap is not None:
        out["budget_usd"] = cap
        out["budget_used"] = f"{usd / cap:.0%}"
    return out
