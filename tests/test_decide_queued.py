"""TPU queued resources (issue #26 item 2) in the pure core: which jobs use one, how a request's states read, a
request that waited longer than the job allows or FAILED (a refusal of its zone: deleted, then the next zone), a
preempted Spot request (SUSPENDING/SUSPENDED: a preemption, deleted before the next request). No fakes: Observations
in, Decisions out (the invariant sweep over every state × request state is tests/test_decide_table.py's grid)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from respawn.control import decide as core
from respawn.control import actions
from respawn.control.models import queued
from respawn.control.actions import Act
from respawn.control.observation import Phase, phase_of
from respawn.schema import State
from test_decide_table import NOW, TPU, TPU_QUEUED, ZONES, make_spec, obs

Q = dict(spec=TPU_QUEUED, heartbeat="none")
WAITED = NOW - timedelta(minutes=11)  # past TPU_QUEUED's 10 min


def tpu(accelerator_type="v4-8", **acc):
    return make_spec(accelerator={"kind": "tpu", "accelerator_type": accelerator_type,
                                  "runtime_version": "tpu-ubuntu2204-base", **acc})


@pytest.mark.parametrize("spec,uses", [
    (TPU, False),  # a single host: created directly
    (TPU_QUEUED, True),  # a multi-host slice: through a queued resource by default
    (tpu(queued_resource=True), True),
    (tpu("v4-16", queued_resource=False), False),
    (make_spec(accelerator={"kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "r"},
               provisioning="preemptible"), False),  # a queued resource has no preemptible tier
    (make_spec(), False),
], ids=["single-host", "slice", "asked", "refused", "preemptible-slice", "gpu"])
def test_which_jobs_use_a_queued_resource(spec, uses):
    assert queued.enabled(spec) is uses
    assert queued.provider_key(spec) == (queued.PROVIDER if uses else spec.accelerator.kind)


@pytest.mark.parametrize("raw,phase", [
    ("queued:CREATING", Phase.BOOTING), ("queued:WAITING_FOR_RESOURCES", Phase.BOOTING),
    ("queued:ACCEPTED", Phase.BOOTING), ("queued:PROVISIONING", Phase.BOOTING), ("queued:ACTIVE", Phase.BOOTING),
    ("queued:FAILED", Phase.DEAD), ("queued:SUSPENDING", Phase.STOPPING), ("queued:SUSPENDED", Phase.DEAD),
    ("queued:DELETING", Phase.DELETING), ("READY", Phase.RUNNING),
])
def test_request_states_as_phases(raw, phase):
    assert phase_of("tpu", raw) is phase


def test_every_request_state_of_the_client_has_a_phase():
    tpu_v2 = pytest.importorskip("google.cloud.tpu_v2")
    states = set(tpu_v2.QueuedResourceState.State.__members__) - {"STATE_UNSPECIFIED"}
    assert {s for s in states if phase_of("tpu", queued.raw(s)) is Phase.UNKNOWN} == set()


def test_a_request_waiting_within_its_limit_is_polled():
    d = core.decide(obs("PROVISIONING", raw="queued:WAITING_FOR_RESOURCES", node_started_at=NOW - timedelta(minutes=9),
                        **Q))
    assert d.action == actions.POLL and d.status is None


@pytest.mark.parametrize("raw,started", [("queued:WAITING_FOR_RESOURCES", WAITED), ("queued:ACCEPTED", WAITED),
                                         ("queued:FAILED", NOW - timedelta(minutes=1))],
                         ids=["waited-out", "accepted-waited-out", "failed"])
def test_a_request_the_zone_did_not_serve_is_deleted_as_a_refusal_then_the_next_zone(raw, started):
    d = core.decide(obs("PROVISIONING", raw=raw, node_started_at=started, consecutive_failures=1, preemptions=2, **Q))
    assert (d.action.kind, d.action.node, d.action.zone) == (Act.DELETE, "job-3", ZONES[0])
    st = d.status
    assert (st.state, st.create_state, st.consecutive_failures, st.tried_zones) == (
        State.PROVISIONING, "failed", 2, [ZONES[0]])
    assert (st.preemptions, st.failures, st.restarts) == (2, 0, 1)  # a refusal: neither a preemption nor a failure
    assert d.cause == "zone_refused_queued" and "deleting it, then the next zone" in st.message
    # While its delete runs, wait; once it is gone, the next zone.
    assert core.decide(obs("PROVISIONING", raw="queued:DELETING", create_state="failed", **Q)).action == actions.POLL
    after = core.decide(obs("PROVISIONING", raw=None, create_state="failed", tried_zones=[ZONES[0]],
                            consecutive_failures=2, **Q))
    assert (after.action.kind, after.action.zone, after.action.node) == (Act.CREATE, ZONES[1], "job-4")


def test_a_refused_request_left_behind_by_a_crash_is_deleted_again_not_counted_again():
    d = core.decide(obs("PROVISIONING", raw="queued:FAILED", create_state="failed", consecutive_failures=2, **Q))
    assert d.action.kind is Act.DELETE and d.status is None


def test_every_zone_refusing_its_request_waits_for_capacity():
    d = core.decide(obs("PROVISIONING", raw=None, create_state="failed", tried_zones=ZONES, consecutive_failures=3,
                        **Q))
    assert d.action.kind is Act.WAIT and d.status.state is State.WAITING_FOR_CAPACITY


@pytest.mark.parametrize("raw", ["queued:SUSPENDING", "queued:SUSPENDED"])
def test_a_suspended_spot_request_is_a_preemption_deleted_before_the_next(raw):
    d = core.decide(obs("RUNNING", raw=raw, heartbeat="noticed", spec=TPU_QUEUED, preemptions=1))
    assert (d.action.kind, d.action.node) == (Act.DELETE, "job-3")
    assert (d.status.state, d.cause, d.status.preemptions, d.status.failures) == (State.PREEMPTED, "preempted", 2, 0)
    gone = core.decide(obs("PREEMPTED", raw=None, spec=TPU_QUEUED, heartbeat="none"))
    assert (gone.action.kind, gone.action.node) == (Act.CREATE, "job-4")


def test_an_active_request_whose_node_runs_starts_the_nodes_life_now():
    # Its request may have waited long: the boot grace counts from the node's READY, not from the request.
    d = core.decide(obs("PROVISIONING", raw="READY", node_started_at=WAITED, **Q))
    assert d.status.state is State.RUNNING and d.status.node_started_at == NOW
    plain = core.decide(obs("PROVISIONING", raw="READY", heartbeat="none", spec=TPU, node_started_at=WAITED))
    assert plain.status.node_started_at == WAITED


def test_a_node_of_a_direct_tpu_job_never_reads_as_a_request():
    # The same words in a node's state (CREATING, DELETING) are the node's: no refusal, whatever the wait.
    d = core.decide(obs("PROVISIONING", raw="CREATING", node_started_at=WAITED, **Q))
    assert d.action == actions.POLL


def test_a_create_refused_for_the_leaving_requests_quota_deletes_that_request_before_asking_again():
    # A SUSPENDED request (a preempted TPU node too) holds quota until deleted, past its notice window: the head
    # start's create refused for quota is asked again only once the leaving request is gone.
    from respawn.schema import Leaving

    leaving = Leaving(node="job-3", zone=ZONES[0], attempt=3, until=NOW - timedelta(seconds=1))
    o = obs("PROVISIONING", raw=None, attempt=4, node="job-4", zone=ZONES[0], create_state="failed",
            next_attempt_at=leaving.until, leaving=leaving, **Q)
    d = core.decide(o)
    assert (d.action.kind, d.action.node) == (Act.DELETE, "job-3") and d.status.leaving is None
    after = core.decide(obs("PROVISIONING", raw=None, attempt=4, node="job-4", zone=ZONES[0], create_state="failed",
                            next_attempt_at=leaving.until, **Q))
    assert (after.action.kind, after.action.zone, after.action.node) == (Act.CREATE, ZONES[0], "job-5")


def test_requests_refused_in_a_row_move_the_next_request_to_the_guaranteed_tier():
    # provisioning [spot, standard]: a queued resource's tiers are spot and guaranteed (the adapter maps standard).
    spec = make_spec(accelerator={"kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
                                  "queue_wait_minutes": 10},
                     provisioning=[{"model": "spot", "after_refusals": 2}, "standard"])
    refused = core.decide(obs("PROVISIONING", raw="queued:FAILED", spec=spec, heartbeat="none", consecutive_failures=1,
                              tried_zones=[ZONES[1]]))
    assert refused.action.kind is Act.DELETE and refused.status.consecutive_failures == 2
    d = core.decide(obs("PROVISIONING", raw=None, spec=spec, heartbeat="none", create_state="failed",
                        consecutive_failures=2, tried_zones=ZONES[:2]))
    assert (d.action.kind, d.action.provisioning, d.action.zone) == (Act.CREATE, "standard", ZONES[0])
    assert d.details["tier_why"] == "spot: refused 2 times in a row"
