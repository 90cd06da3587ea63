"""Which labelled nodes belong to no current placement (pure). The sweep deletes them: defence in depth for the
one invariant that costs money, "never more than one live node per job".

A node labelled `respawn-job=J, respawn-attempt=A` is an orphan when job J does not exist any more, or J is
finished, or (name, zone) is neither the current node of J (of one of its member slots, for a job of several nodes)
nor a node one of them replaced during its notice and is still saving (`leaving`). Decide never commits a new
attempt before the previous node is gone or recorded as leaving, so such a node can only come from a create that finished after its job moved on and whose function
died before deleting it, or from a job document deleted while its node ran. A Cloud TPU queued resource is judged
the same way (Seen kind queued.PROVIDER, its node's labels; handlers.delete_orphans lists them in TPU zones): one
that was filled after its job moved on, or that a crash left FAILED or SUSPENDED, still holds quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from respawn.contract import LABEL_ATTEMPT, LABEL_JOB
from respawn.schema import MAX_ATTEMPT, State, node_name

FINISHED = {s.value for s in State if s.terminal}


@dataclass(frozen=True)
class Seen:
    kind: str  # gpu | tpu
    zone: str
    name: str
    labels: Mapping[str, str]


def orphans(nodes: list[Seen], jobs: Mapping[str, Mapping[str, Any]]) -> list[Seen]:
    """nodes: what the APIs listed in the scanned zones; jobs: job id → its `status` map (every job document),
    read *after* the listing: a create always follows the commit of its attempt, so a listed node's attempt is
    never newer than the status read afterwards (no in-flight create is mistaken for an orphan)."""
    out = []
    for n in nodes:
        job = n.labels.get(LABEL_JOB)
        attempt = n.labels.get(LABEL_ATTEMPT, "")
        if not job or not attempt.isdigit() or not 1 <= int(attempt) <= MAX_ATTEMPT or n.name != node_name(job, int(attempt)):
            continue  # not a Respawn node (or labels edited by hand): leave it alone
        status = jobs.get(job)
        if status is None:
            out.append(n)  # its job document is gone
            continue
        members = status.get("members") or []
        current = {(m.get("node"), m.get("zone")) for m in members} or {(status.get("node"), status.get("zone"))}
        current |= {(m["leaving"].get("node"), m["leaving"].get("zone")) for m in members if m.get("leaving")}
        if status.get("state") in FINISHED or (n.name, n.zone) not in current:
            out.append(n)
    return out
