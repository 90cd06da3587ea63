"""Reserved capacity as a provisioning model (issue #34 item 1; docs/gcp-facts.md §26): the create body the model
gives a node (SPECIFIC_RESERVATION by name, a shared one by its path), the sim serving a reservation of a size (its
in-use VMs counted, a full one refusing as Compute Engine does, a missing one refused), and the pure core moving
between the reservation and Spot in either tier order. Real client against sim/, no fakes."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from google.api_core import exceptions as gexc

from respawn.control import alerts
from respawn.control import clients as factory
from respawn.control import decide as core
from respawn.control import losses
from respawn.control import models, placement
from respawn.control.adapters.compute import ComputeProvider
from respawn.contract import ATTR_RUN_ENDS_AT
from respawn.control.actions import Act
from respawn.control.models import RUN_END_SLACK
from respawn.schema import SpecError, parse_spec
from functions_fixtures import T4, controller, gpu_spec, tpu_spec  # noqa: F401
from sim_fixtures import PROJECT, sim_factory, sim_server  # noqa: F401
from test_decide_table import NOW, ZONES, make_spec, obs

ZONE = "us-central1-a"
MINE = {"model": "reservation", "reservation": "my-res", "zone": ZONE, "after_refusals": 1}
RESERVED_FIRST = [MINE, "spot"]
SPOT_FIRST = [{"model": "spot", "after_refusals": 2}, {k: v for k, v in MINE.items() if k != "after_refusals"}]


@pytest.fixture
def made(sim_server):
    return factory.Clients(factory.Endpoints(PROJECT, sim_server.endpoint, sim_server.endpoint))


def reserved_spec(tiers=RESERVED_FIRST, **over):
    return parse_spec(gpu_spec("res", provisioning=tiers, termination_action=None, **over))


def test_a_reservation_node_names_its_reservation_and_is_standard(made, sim_server):
    sim_server.set_capacity(ZONE, T4, 1, provisioning_model="RESERVATION")
    gce = ComputeProvider(made)
    assert gce.create(reserved_spec(), ZONE, "res-1", 1, "reservation", "#!/bin/bash\n") is True
    inst = made.instances().get(project=PROJECT, zone=ZONE, instance="res-1")
    assert inst.status == "RUNNING"
    assert inst.scheduling.provisioning_model == "STANDARD" and inst.scheduling.on_host_maintenance == "TERMINATE"
    aff = inst.reservation_affinity
    assert (aff.consume_reservation_type, aff.key, list(aff.values)) == (
        "SPECIFIC_RESERVATION", "compute.googleapis.com/reservation-name", ["my-res"])
    # The reservation's one VM is in use: the next is refused, in words placement reads as the pool's capacity.
    with pytest.raises(gexc.ServiceUnavailable) as full:
        gce.create(reserved_spec(), ZONE, "res-2", 2, "reservation", "#!/bin/bash\n")
    refused = placement.classify(full.value)
    assert refused.kind == "capacity" and "my-res does not have sufficient capacity" in refused.message
    assert placement.pools_refused("capacity", "reservation") == ["reservation"]  # Spot stays free to try
    gce.delete(ZONE, "res-1")  # its VM gone, the reservation serves again
    assert gce.create(reserved_spec(), ZONE, "res-3", 3, "reservation", "#!/bin/bash\n") is True
    # A Spot VM beside it is not the reservation's, and a reservation VM is never preempted.
    assert gce.create(reserved_spec(), ZONE, "res-4", 4, "spot", "#!/bin/bash\n") is True
    from sim.core import SimError
    with pytest.raises(SimError, match="never preempted"):
        sim_server.compute.events.preempt(ZONE, "res-3")


def test_a_shared_reservation_is_named_by_its_path_and_a_missing_one_fails_the_create(made, sim_server):
    shared = {**MINE, "reservation": "projects/owner-project/reservations/team-res"}
    spec = reserved_spec([shared, "spot"])
    body = ComputeProvider(made).instance(spec, ZONE, "res-1", 1, "reservation", "")
    assert list(body.reservation_affinity.values) == ["projects/owner-project/reservations/team-res"]
    # No reservation in the zone: refused at once, a fault of the spec no other zone fixes.
    with pytest.raises(gexc.BadRequest) as missing:
        ComputeProvider(made).create(spec, ZONE, "res-1", 1, "reservation", "#!/bin/bash\n")
    assert placement.classify(missing.value).kind == "fatal"
    assert "Could not find the given reservation" in str(missing.value)


def test_a_calendar_reservation_node_is_reservation_bound_and_deleted_at_the_reservations_end(made, sim_server):
    """Audit 4: a calendar-mode reservation takes RESERVATION_BOUND VMs only (the old STANDARD body is refused);
    its node carries the end for its agent and is deleted by Compute at the end, as its termination action says."""
    ends = datetime.now(timezone.utc) + timedelta(seconds=4)
    sim_server.set_capacity(ZONE, T4, 2, provisioning_model="RESERVATION")
    sim_server.set_reservation_end(ZONE, T4, ends.timestamp())
    gce = ComputeProvider(made)
    with pytest.raises(gexc.BadRequest, match="RESERVATION_BOUND instances only") as old:
        gce.create(reserved_spec(), ZONE, "cal-0", 1, "reservation", "#!/bin/bash\n")
    assert placement.classify(old.value).kind == "fatal"
    bound = reserved_spec([{**MINE, "ends_at": ends.isoformat()}, "spot"])
    assert gce.create(bound, ZONE, "cal-1", 1, "reservation", "#!/bin/bash\n") is True
    inst = made.instances().get(project=PROJECT, zone=ZONE, instance="cal-1")
    sched = inst.scheduling
    assert (sched.provisioning_model, sched.instance_termination_action, sched.on_host_maintenance,
            sched.automatic_restart) == ("RESERVATION_BOUND", "DELETE", "TERMINATE", True)
    assert inst.reservation_affinity.consume_reservation_type == "SPECIFIC_RESERVATION"
    [end] = [i.value for i in inst.metadata.items if i.key == ATTR_RUN_ENDS_AT]
    assert datetime.fromisoformat(end.replace("Z", "+00:00")) == ends
    sim_server.wait_for(lambda: sim_server.status_of(ZONE, "cal-1") is None, timeout=15, what="the reservation's end")
    assert not [e for e in sim_server.audit_log if "preempted" in str(e)]
    with pytest.raises(gexc.BadRequest, match="Could not find the given reservation"):  # it no longer exists
        gce.create(bound, ZONE, "cal-2", 2, "reservation", "#!/bin/bash\n")


def test_every_other_node_names_no_reservation(made):
    """Audit 4: left out, the affinity is ANY_RESERVATION, and an on-demand node could take an open reservation of
    the project that the ledger prices on demand."""
    spec = reserved_spec([{"model": "standard", "after_refusals": 1}, {"model": "preemptible", "after_refusals": 1},
                          "spot"])
    for model in ("standard", "preemptible", "spot"):
        body = ComputeProvider(made).instance(spec, ZONE, "n-1", 1, model, "")
        assert body.reservation_affinity.consume_reservation_type == "NO_RESERVATION", model


def test_the_end_of_a_calendar_reservation_is_a_planned_stop_and_the_next_node_takes_the_next_tier():
    ends = NOW + timedelta(hours=1)
    spec = make_spec(provisioning=[{**MINE, "ends_at": ends.isoformat()}, "spot"], termination_action=None)
    running = core.decide(obs("PROVISIONING", raw="RUNNING", heartbeat="none", spec=spec, provisioning="reservation"))
    assert running.status.run_ends_at == ends
    ended = core.decide(replace(obs("RUNNING", raw=None, spec=spec, provisioning="reservation", preemptions=2,
                                    run_ends_at=ends), now=ends + timedelta(seconds=20)))
    assert ended.cause == losses.RUN_ENDED and ended.status.preemptions == 2 and ended.alert is None
    assert (ended.action.kind, ended.action.provisioning) == (Act.CREATE, "spot")
    assert ended.details["tier_why"] == f"reservation: its reservation my-res ends at {ends.isoformat()}"
    # Long before its end, a lost reservation node is a loss like an on-demand one's, and the reservation serves on.
    early = core.decide(obs("RUNNING", raw=None, spec=spec, provisioning="reservation", run_ends_at=ends,
                            preemptions=2))
    assert early.cause != losses.RUN_ENDED and early.action.provisioning == "reservation"
    with pytest.raises(SpecError, match="ends_at applies to reservation tiers only"):
        make_spec(provisioning=[{"model": "spot", "ends_at": ends.isoformat()}, "standard"])
    with pytest.raises(SpecError, match="has no UTC offset"):
        make_spec(provisioning=[{**MINE, "ends_at": "2026-12-20T00:00:00"}, "spot"])


def test_the_spec_names_the_reservation_and_its_zone():
    for tier, words in [({"model": "reservation", "zone": ZONE}, "names its reservation and the reservation's zone"),
                        ({**MINE, "zone": "europe-west4-a"}, "zone europe-west4-a is not one of the job's zones"),
                        ({**MINE, "reservation": "Bad_Name"}, "'Bad_Name' is not a reservation"),
                        ({"model": "spot", "reservation": "my-res"}, "reservation applies to reservation tiers only")]:
        with pytest.raises(SpecError, match=words):
            reserved_spec([tier, "standard"])
    with pytest.raises(SpecError, match="a reservation is a tier that names it"):
        parse_spec(gpu_spec("res", provisioning="reservation", termination_action=None))
    with pytest.raises(SpecError, match="reservation tiers are Compute Engine VMs"):
        parse_spec(tpu_spec("res", provisioning=RESERVED_FIRST))


def test_reservation_first_then_spot_when_it_is_full_and_back_when_it_serves():
    """"My reservation first, Spot when it is full": one refusal moves the next node to Spot in the job's zones;
    once a node ran, the next round starts at the reservation again."""
    spec = make_spec(provisioning=RESERVED_FIRST, termination_action=None)
    first = core.decide(obs("PENDING", raw=None, heartbeat="none", spec=spec))
    assert (first.action.provisioning, first.action.zone) == ("reservation", ZONE)
    full = core.decide(obs("PROVISIONING", raw=None, heartbeat="none", spec=spec, provisioning="reservation",
                           create_state="failed", consecutive_failures=1, tried_zones=[ZONE]))
    assert (full.action.kind, full.action.provisioning, full.action.zone) == (Act.CREATE, "spot", ZONES[0])
    assert full.details["tier_why"] == "reservation: refused 1 times in a row"
    lost = core.decide(obs("RUNNING", raw=None, spec=spec, provisioning="spot", preemptions=2))
    assert (lost.action.provisioning, lost.status.preemptions) == ("reservation", 3)


def test_spot_first_then_the_reservation_when_spot_is_dry():
    spec = make_spec(provisioning=SPOT_FIRST)
    dry = core.decide(obs("PROVISIONING", raw=None, heartbeat="none", spec=spec, create_state="failed",
                          consecutive_failures=2, tried_zones=ZONES[:2]))
    assert (dry.action.provisioning, dry.action.zone) == ("reservation", ZONE)
    assert "spot: refused 2 times in a row" in dry.status.message
    # Spot's cooldown in the zone does not keep the reservation out of it (a pool of its own).
    cooled = {placement.pool_key(z, "spot"): NOW + timedelta(minutes=5) for z in ZONES}
    blocked = core.decide(obs("PROVISIONING", raw=None, heartbeat="none", spec=spec, create_state="failed",
                              consecutive_failures=2, tried_zones=ZONES[:2], blocked=cooled))
    assert blocked.action.zone == ZONE


def test_the_reservation_model_is_registered_under_its_spec_name_and_prices_on_demand():
    m = models.of("reservation")
    assert (m.name, m.capacity_pool, m.price_key, m.tpu) == ("reservation", "reservation", "standard", False)
    assert set(models.names()) == {"spot", "preemptible", "flex-start", "standard", "reservation"}
    with pytest.raises(ValueError, match="is not a provisioning model"):
        models.of("cheap")


def test_a_reservation_member_is_a_generations_master_as_an_on_demand_one_is():
    """Never preempted: of a Spot slot and a reservation slot, the reservation's node is the master (the lasting
    member the others meet at), as an on-demand slot's is."""
    from respawn.control.membership import SlotView, form_generation
    views = [SlotView(0, "job-1", True, "10.0.0.1", "spot"), SlotView(1, "job-2", True, "10.0.0.2", "reservation")]
    g = form_generation(None, views)
    assert g is not None and g.members[0] == "job-2" and g.master_addr == "10.0.0.2"
    spot_only = form_generation(None, [SlotView(0, "job-1", True, "10.0.0.1", "spot"),
                                       SlotView(1, "job-2", True, "10.0.0.2", "spot")])
    assert spot_only is not None and spot_only.members[0] == "job-1"


def test_a_calendar_reservation_job_runs_reservation_bound_until_the_end_then_on_spot(controller):
    """Through the control plane's entry points: the job's node consumes the calendar reservation as a
    RESERVATION_BOUND VM; Compute deletes it at the reservation's end (here a little before the spec's end, within
    the slack), which is a planned stop, and the next node is Spot."""
    ends = datetime.now(timezone.utc) + RUN_END_SLACK + timedelta(seconds=8)
    controller.sim.set_capacity(ZONE, T4, 1, provisioning_model="RESERVATION")
    controller.sim.set_reservation_end(ZONE, T4, (ends - RUN_END_SLACK + timedelta(seconds=2)).timestamp())
    job = controller.register(gpu_spec("cal", termination_action=None,
                                       provisioning=[{**MINE, "ends_at": ends.isoformat()}, "spot"]))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.node, st.provisioning, st.members[0].run_ends_at) == ("cal-1", "reservation", ends)
    [node] = controller.live(job)
    assert node["attributes"][ATTR_RUN_ENDS_AT] == ends.isoformat().replace("+00:00", "Z")
    controller.sim.wait_for(lambda: controller.sim.status_of(ZONE, "cal-1") is None, timeout=30,
                            what="the reservation's end")
    deadline = time.monotonic() + 30
    while (st := controller.status(job)).node == "cal-1" or st.state.value != "RUNNING":
        assert time.monotonic() < deadline, f"{st.state.value}: {st.message}"
        assert controller.sweep(job) == 200
        time.sleep(0.2)
    assert (st.provisioning, st.preemptions, st.failures, st.last_cause) == ("spot", 0, 0, losses.RUN_ENDED)
    why = [e.get("details", {}).get("tier_why", "") for e in controller.events(job)]
    assert any(f"its reservation my-res ends at {ends.isoformat()}" in w for w in why), why


def test_a_full_reservation_sends_the_node_to_spot_and_after_its_preemption_the_job_comes_back(controller):
    """Through the control plane's entry points (what the reservation demo scenario showed, moved down from
    tests/test_demo_scenarios.py): the reservation's VMs all in use, its insert is refused and that one refusal moves
    the node to Spot in the same zone, with no wait for capacity; the Spot node is preempted once the reservation
    serves again (its cooldown over) and the next placement round starts at the reservation."""
    controller.sim.set_capacity(ZONE, T4, 0, provisioning_model="RESERVATION")
    job = controller.register(gpu_spec("resfb", termination_action=None, provisioning=RESERVED_FIRST,
                                       placement={"cooldown_seconds": 2}))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert (st.provisioning, st.zone) == ("spot", ZONE)
    steps = [(e["to_state"], e["cause"], e["details"].get("provisioning")) for e in controller.events(job)
             if e.get("details", {}).get("provisioning")]
    assert steps[:2] == [("PROVISIONING", "job_created", "reservation"), ("PROVISIONING", "zone_refused", "spot")]
    # A VM of the reservation is free again and its refusal's cooldown is over; then the Spot node is preempted.
    controller.sim.set_capacity(ZONE, T4, 1, provisioning_model="RESERVATION")
    ends = [r["until"] for r in controller.capacity().values() if isinstance(r.get("until"), datetime)]
    assert ends, controller.capacity()
    controller.sim.wait_for(lambda: datetime.now(timezone.utc) > max(ends), 10, "the reservation's cooldown over")
    controller.heartbeat(st.node, step=200, committed_step=200)
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    deadline = time.monotonic() + 30
    while (after := controller.status(job)).node == st.node or after.state.value != "RUNNING":
        assert time.monotonic() < deadline, f"{after.state.value}: {after.message}"
        assert controller.sweep(job) == 200
        time.sleep(0.2)
    assert (after.provisioning, after.zone, after.preemptions) == ("reservation", ZONE, 1)
    [node] = controller.live(job)
    assert node["name"] == after.node
    controller.heartbeat(after.node, step=202, committed_step=200, first_step=201,
                         started_at=datetime.now(timezone.utc))
    assert controller.sweep(job) == 200
    assert "WAITING_FOR_CAPACITY" not in [e["to_state"] for e in controller.events(job)]
    heard = controller.alerts(want=1)
    [recovered] = [a for a in heard if a["type"] == "recovered"]
    assert "preemptions: 1" in alerts.to_slack(recovered)["text"]
