"""functions/stats.py, pure: what a committed decision adds to every job's per zone × accelerator statistics."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from respawn.control.stats import Observed, observed
from respawn.schema import JobStatus, MemberStatus, State, ZoneStats

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(seconds=100)
A, B = "us-central1-a", "us-central1-b"


def job(*members: MemberStatus, preemptions: int = 0) -> JobStatus:
    return JobStatus(members=list(members), preemptions=preemptions)


def m(state: State, node: str | None = "j-1", zone: str = A, model: str = "spot") -> MemberStatus:
    return MemberStatus(state=state, node=node, zone=zone, provisioning=model, node_started_at=T0 if node else None)


@pytest.mark.parametrize("before, after, seen", [
    # Obtained: PROVISIONING → RUNNING, its time since the create.
    (job(m(State.PROVISIONING)), job(m(State.RUNNING)), [Observed(A, "spot", {"nodes": 1, "obtain_seconds": 100})]),
    # Preempted: a life that ended, and the job's preemptions grew.
    (job(m(State.RUNNING)), job(m(State.PREEMPTED), preemptions=1),
     [Observed(A, "spot", {"lives": 1, "life_seconds": 100, "preemptions": 1})]),
    # Replaced during its notice (a new node in another zone): the old one's life, in its own zone.
    (job(m(State.RUNNING)), job(m(State.PROVISIONING, "j-2", B), preemptions=1),
     [Observed(A, "spot", {"lives": 1, "life_seconds": 100, "preemptions": 1})]),
    # Its life counts from when it ran, where the status knows it.
    (job(m(State.RUNNING).model_copy(update={"running_at": T0 + timedelta(seconds=40)})),
     job(m(State.PREEMPTED), preemptions=1), [Observed(A, "spot", {"lives": 1, "life_seconds": 60, "preemptions": 1})]),
    # A life that ended without a preemption (a crash, the job done): exposure, no interruption.
    (job(m(State.RUNNING, model="standard")), job(m(State.SUCCEEDED, model="standard")),
     [Observed(A, "standard", {"lives": 1, "life_seconds": 100})]),
    # Nothing about capacity: still running, still provisioning, no node yet.
    (job(m(State.RUNNING)), job(m(State.RUNNING)), []),
    (job(m(State.PROVISIONING)), job(m(State.PROVISIONING)), []),
    (job(m(State.PENDING, node=None)), job(m(State.PROVISIONING)), []),
    # Two members, one preemption: counted once.
    (job(m(State.RUNNING), m(State.RUNNING, "j-2")), job(m(State.PREEMPTED), m(State.RUNNING, "j-2"), preemptions=1),
     [Observed(A, "spot", {"lives": 1, "life_seconds": 100, "preemptions": 1})]),
])
def test_observed(before, after, seen):
    assert observed(before, after, NOW) == seen


def test_zone_stats_derive_the_means():
    s = ZoneStats(nodes=4, obtain_seconds=200, lives=3, life_seconds=7200, preemptions=2)
    assert (s.obtain_mean_seconds, s.mtbi_seconds) == (50, 3600)
    assert ZoneStats().mtbi_seconds is None
