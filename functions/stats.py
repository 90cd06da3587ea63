"""Respawn's own capacity statistics (issue #26 item 4), pure: what one committed decision tells about the zones
its nodes ran in, as increments of the per zone × accelerator statistics every job adds to (the `stats` map of
capacity/{zone}~{accelerator}, schema.ZoneStats, kept per provisioning model). Refusals are counted where they are
recorded (the store's record_capacity); here, from a job's status before and after a decision:

- a node obtained: a slot's node went from PROVISIONING to RUNNING (a create or a restart in place): `nodes` + 1,
  `obtain_seconds` + the time since it was asked for (node_started_at);
- a node's life ended: a slot whose node ran no longer runs it (lost, replaced, the job ended): `lives` + 1,
  `life_seconds` + its time since it ran (running_at; a status of an older version: since node_started_at);
  `preemptions` + 1 when the job's preemptions grew with it (the platform took it). Life over preemptions is the mean time between interruptions (ZoneStats.mtbi_seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from respawn.schema import DEFAULT_MODEL, JobStatus, State


@dataclass(frozen=True)
class Observed:
    zone: str
    model: str  # the node's provisioning model (functions/models/: its name in the spec)
    counts: dict[str, float]  # ZoneStats field → increment


def observed(before: JobStatus, after: JobStatus, now: datetime) -> list[Observed]:
    """The statistics increments of the change from `before` to `after` (one job's committed status)."""
    out = []
    preempted = max(after.preemptions - before.preemptions, 0)
    for b, a in zip(before.members or [before], after.members or [after]):
        if not (b.node and b.zone and b.node_started_at):
            continue
        model = b.provisioning or DEFAULT_MODEL
        age = max((now - b.node_started_at).total_seconds(), 0.0)
        if b.state is State.PROVISIONING and a.state is State.RUNNING and a.node == b.node:
            out.append(Observed(b.zone, model, {"nodes": 1, "obtain_seconds": age}))
        elif b.state is State.RUNNING and (a.node != b.node or a.state is not State.RUNNING):
            ran = max((now - (b.running_at or b.node_started_at)).total_seconds(), 0.0)
            counts = {"lives": 1, "life_seconds": ran}
            if preempted:
                preempted -= 1
                counts["preemptions"] = 1
            out.append(Observed(b.zone, model, counts))
    return out
