"""The cost ledger and the budget (issue #27 item 3). Pure: no cloud library, no I/O, no clock.

Every node life is priced (respawn/prices.py: machine type, GPUs or TPU chips, boot disk, for the node's
provisioning model in its region). A life opens when a committed status first shows its slot RUNNING (the VM is
billed from its start: gcp-facts §24) at the node's price an hour, kept on the slot (MemberStatus.billing); it
closes, and its hours × price go into the job's ledger (JobStatus.cost), when a committed status shows the slot with
another node or another life of it (a restart in place), or no longer live, or the job over. So the cost so far is
the closed lives plus each open life's hours to now: a few fields of the status, never a scan of the events
(respawn/ledger.py reads it, below the control plane: the CLI and the demo show it).

A lost node's life runs until its replacement is committed (it is deleted before, or during its notice, beside
it): a few seconds to a minute more than the VM ran, never less, so the budget errs on the safe side.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from respawn.ledger import hours, spent
from respawn.prices import Quote
from respawn.schema import BilledLife, JobStatus, MemberStatus, State

from . import models

LIVE = (State.PROVISIONING, State.RUNNING, State.PREEMPTED, State.RESTARTING)
# Budget alerts below the cap, in percent, each sent once per cap; at 100 % the job stops (BUDGET_EXHAUSTED).
ALERT_PERCENTS = (50, 80)


def burn(s: JobStatus) -> float:
    """USD an hour the job's open lives cost now."""
    return sum(m.billing.usd_per_hour for m in s.members if m.billing is not None)


def over_budget(s: JobStatus, cap: float, now: datetime, lookahead_seconds: float) -> bool:
    """The cost reaches `cap` within `lookahead_seconds` at the current burn: the job must stop now, since the
    next look (the sweep) may come only that much later."""
    return spent(s, now)[0] + burn(s) * lookahead_seconds / 3600 >= cap


def needs_quote(s: JobStatus) -> bool:
    """Whether observe() reads the job's prices: a slot holds a live node whose life is not priced yet."""
    return not s.state.terminal and any(m.node and m.state in LIVE and m.billing is None for m in s.members)


def _goes_on(a: MemberStatus, life: BilledLife, after: JobStatus) -> bool:
    return (a.billing is life and not after.state.terminal and a.state in LIVE
            and (a.node, a.node_started_at) == (life.node, life.started_at))


def account(before: JobStatus, after: JobStatus, now: datetime, quote: Quote | None) -> JobStatus:
    """`after` (a decided status) with its lives booked: those that ended closed into the ledger, a slot newly
    RUNNING opened at its model's price (`quote`; None: not read, the life opens at the next pass that reads it)."""
    members = list(after.members)
    cost = after.cost
    closed, closed_on_demand, note, unpriced = (cost.closed_usd, cost.closed_on_demand_usd, cost.note,
                                                cost.unpriced)
    for i in range(max(len(before.members), len(members))):
        b = before.members[i] if i < len(before.members) else None
        a = members[i] if i < len(members) else None
        # A life the decision dropped with its slot (a fresh member: the whole job moves) closes from `before`.
        life = a.billing if a is not None and a.billing is not None else (b.billing if b is not None else None)
        if life is not None and (a is None or not _goes_on(a, life, after)):
            h = hours(life.since, now)
            closed += h * life.usd_per_hour
            closed_on_demand += h * life.on_demand_usd_per_hour
            life = None
            if a is not None and a.billing is not None:
                a = a.model_copy(update={"billing": None})
        if a is not None and life is None and not after.state.terminal and a.state is State.RUNNING and a.node:
            rate = quote.rates.get(models.of(a.provisioning).price_key) if quote is not None else None
            if rate is not None:
                a = a.model_copy(update={"billing": BilledLife(
                    node=a.node, started_at=a.node_started_at, since=now, usd_per_hour=rate.usd_per_hour,
                    on_demand_usd_per_hour=rate.on_demand_usd_per_hour)})
                note, unpriced = rate.note, None
            elif quote is not None:
                unpriced = quote.why or f"no price for {a.provisioning} nodes"
        if a is not None:
            members[i] = a
    ledger = cost.model_copy(update={"closed_usd": round(closed, 6), "closed_on_demand_usd": round(closed_on_demand, 6),
                                     "note": note, "unpriced": unpriced})
    if members == list(after.members) and ledger == cost:
        return after
    return after.model_copy(update={"members": members, "cost": ledger})


def alert_fields(s: JobStatus, now: datetime) -> dict[str, Any]:
    """What an alert says of the cost so far (alerts.py renders it)."""
    usd, on_demand = spent(s, now)
    return {"cost_usd": round(usd, 6), "on_demand_usd": round(on_demand, 6), "cost_note": s.cost.note}


def alert_due(s: JobStatus, cap: float, now: datetime) -> int | None:
    """The budget alert (percent of `cap`) to send now: the highest of ALERT_PERCENTS reached and not yet sent."""
    usd = spent(s, now)[0]
    reached = [p for p in ALERT_PERCENTS if usd >= cap * p / 100 and p > s.cost.alerted_percent]
    return max(reached) if reached else None
