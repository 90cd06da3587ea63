"""Jobs of several GPU VMs through the control plane's entry points (Functions Framework, real CloudEvents, the
Firestore/Pub/Sub emulators, sim/ through the real Compute client): only a lost member is replaced, the
survivors keep their VMs, every membership is written to the members as a generation, and the fault matrix's
guarantees hold (never more than `nodes` live, never two nodes for one slot, one zone except during a move)."""

from __future__ import annotations

import json

from respawn.contract import ATTR_GENERATION, LABEL_SLOT
from functions_fixtures import T4, ZONES, controller, gpu_spec  # noqa: F401
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def _spec(job: str, **over):
    return gpu_spec(job, termination_action="DELETE", placement={"cooldown_seconds": 1}, **over)


def _members(controller, job):
    return [m.node for m in controller.status(job).members]


def _beat_all(controller, job, state="waiting", **kw):
    for node in _members(controller, job):
        if node:
            controller.heartbeat(node, state=state, **kw)


def _swept_until(controller, predicate, timeout, what):
    """Sweep (as Cloud Scheduler would) and look again until `predicate()` holds."""
    controller.sim.wait_for(lambda: (controller.sweep() or True) and predicate(), timeout=timeout, what=what)


def _generation(controller, job, expect_number, timeout=30):
    """Wait until generation `expect_number` is written into every member's metadata; the generation."""
    def written():
        st = controller.status(job)
        if not st.generation or st.generation["number"] != expect_number:
            return False
        live = {n["name"]: n for n in controller.live(job)}
        return all(json.loads(live[m]["attributes"].get(ATTR_GENERATION) or "{}").get("number") == expect_number
                   for m in st.generation["members"] if m in live)
    deadline_what = f"generation {expect_number} of {job} written to its members"
    try:
        _swept_until(controller, written, timeout=timeout, what=deadline_what)
    except Exception:
        raise AssertionError(f"{deadline_what}: status {controller.status(job)}") from None
    return controller.status(job).generation


def _zones_overlap(controller, job):
    """Whether nodes of `job` in two zones were ever live at the same moment."""
    spans = [(r["zone"], s, e if e is not None else float("inf")) for r in controller.sim.history()
             if r["labels"].get("respawn-job") == job for s, e in r["live"]]
    return any(z1 != z2 and s1 < e2 and s2 < e1 for z1, s1, e1 in spans for z2, s2, e2 in spans)


def _placed(controller, job_spec):
    job = controller.register(job_spec)
    assert controller.job_created(job) == 200
    controller.sim.wait_for(lambda: all(_members(controller, job)) and len(controller.live(job)) == job_spec["nodes"]
                            and all(n["status"] == "RUNNING" for n in controller.live(job)), timeout=30,
                            what=f"{job}'s {job_spec['nodes']} nodes running")
    assert controller.sweep() == 200
    _beat_all(controller, job)
    return job, _generation(controller, job, 1)


def test_hybrid_job_places_every_slot_in_one_zone_and_replaces_only_the_lost_spot_node(controller):
    job, g1 = _placed(controller, _spec("hyb", nodes=3, on_demand_nodes=1))
    st = controller.status(job)
    assert st.state.value == "RUNNING" and st.zone == ZONES[0]
    live = {n["name"]: n for n in controller.live(job)}
    assert sorted(live) == ["hyb-1", "hyb-2", "hyb-3"]
    assert [live[m.node]["labels"][LABEL_SLOT] for m in st.members] == ["0", "1", "2"]
    assert [m.provisioning for m in st.members] == ["standard", "spot", "spot"]
    # The on-demand member is the master, by its address as the API lists it.
    assert g1["members"][0] == "hyb-1" and g1["master_addr"] == live["hyb-1"]["address"]
    assert sorted(g1["members"]) == sorted(live)
    ids = {name: n["id"] for name, n in live.items()}

    _beat_all(controller, job, state="training", generation=1)
    controller.sim.preempt(ZONES[0], "hyb-3")
    assert controller.log_event(controller.wait_system_event("hyb-3")) == 200
    controller.sim.wait_for(lambda: "hyb-4" in {n["name"] for n in controller.live(job)}
                            and controller.sim.status_of(ZONES[0], "hyb-4") == "RUNNING", timeout=30,
                            what="the replacement hyb-4 running")
    assert controller.sweep() == 200
    # Until the replacement's agent is ready the survivors hold: the generation stays.
    assert controller.status(job).generation["number"] == 1
    controller.heartbeat("hyb-4", state="waiting")
    for survivor in ("hyb-1", "hyb-2"):
        controller.heartbeat(survivor, state="waiting", generation=1, exit_code=75)
    g2 = _generation(controller, job, 2)
    assert g2["members"] == ["hyb-1", "hyb-2", "hyb-4"] and g2["master_addr"] == g1["master_addr"]

    live = {n["name"]: n for n in controller.live(job)}
    assert sorted(live) == ["hyb-1", "hyb-2", "hyb-4"] and all(n["zone"] == ZONES[0] for n in live.values())
    assert {k: live[k]["id"] for k in ("hyb-1", "hyb-2")} == {k: ids[k] for k in ("hyb-1", "hyb-2")}
    assert live["hyb-4"]["labels"][LABEL_SLOT] == "2"
    st = controller.status(job)
    assert (st.state.value, st.restarts, st.attempt) == ("RUNNING", 1, 4)
    assert controller.sim.max_live(job) == 3 and not _zones_overlap(controller, job)
    slot_lives = {}
    for r in controller.sim.history():
        slot_lives.setdefault(r["labels"][LABEL_SLOT], []).append(r["live"])
    assert sorted(slot_lives) == ["0", "1", "2"] and len(slot_lives["2"]) == 2  # slot 2: hyb-3, then hyb-4
    old, new = sorted(slot_lives["2"], key=lambda lives: lives[0][0])
    assert old[-1][1] is not None and old[-1][1] <= new[0][0]  # never two nodes for one slot


def test_master_lost_next_generation_names_the_lowest_survivor_master(controller):
    job, g1 = _placed(controller, _spec("mst", nodes=2))
    assert g1["members"][0] == "mst-1"
    controller.sim.preempt(ZONES[0], "mst-1")
    assert controller.log_event(controller.wait_system_event("mst-1")) == 200
    controller.sim.wait_for(lambda: controller.sim.status_of(ZONES[0], "mst-3") == "RUNNING", timeout=30,
                            what="mst-3 running")
    controller.heartbeat("mst-3", state="waiting")
    controller.heartbeat("mst-2", state="waiting", generation=1, exit_code=1)
    g2 = _generation(controller, job, 2)
    live = {n["name"]: n for n in controller.live(job)}
    # The master is gone: the member of the lowest slot (slot 0, now mst-3) leads the next generation.
    assert g2["members"] == ["mst-3", "mst-2"] and g2["master_addr"] == live["mst-3"]["address"]


def test_elastic_job_continues_on_survivors_while_the_zone_is_dry_and_grows_back(controller):
    job, g1 = _placed(controller, _spec("ela", nodes=3, min_nodes=2))
    controller.sim.set_capacity(ZONES[0], T4, 2, provisioning_model="SPOT")
    controller.sim.preempt(ZONES[0], "ela-2")
    assert controller.log_event(controller.wait_system_event("ela-2")) == 200
    for survivor in ("ela-1", "ela-3"):
        controller.heartbeat(survivor, state="waiting", generation=1, exit_code=75)
    g2 = _generation(controller, job, 2)
    assert g2["members"] == ["ela-1", "ela-3"]
    st = controller.status(job)
    assert st.state.value == "RUNNING" and st.members[1].state.value == "WAITING_FOR_CAPACITY"
    assert len(controller.live(job)) == 2

    controller.sim.set_capacity(ZONES[0], T4, None, provisioning_model="SPOT")
    _swept_until(controller, lambda: controller.status(job).members[1].node
                 and controller.sim.status_of(ZONES[0], controller.status(job).members[1].node) == "RUNNING",
                 timeout=30, what="slot 1 refilled once capacity returns")
    back = controller.status(job).members[1].node
    controller.heartbeat(back, state="waiting")
    for survivor in ("ela-1", "ela-3"):
        controller.heartbeat(survivor, state="waiting", generation=2, exit_code=75)
    g3 = _generation(controller, job, 3)
    assert g3["members"] == ["ela-1", back, "ela-3"]
    assert controller.sim.max_live(job) == 3 and not _zones_overlap(controller, job)


def test_too_few_survivors_move_the_whole_job_to_the_next_zone(controller):
    job, _ = _placed(controller, _spec("mov", nodes=2))
    controller.sim.set_capacity(ZONES[0], T4, 1, provisioning_model="SPOT")
    controller.sim.preempt(ZONES[0], "mov-2")
    assert controller.log_event(controller.wait_system_event("mov-2")) == 200
    _swept_until(controller, lambda: len(controller.live(job)) == 2
                 and all(n["zone"] == ZONES[1] and n["status"] == "RUNNING" for n in controller.live(job)),
                 timeout=40, what="the job moved to the next zone")
    st = controller.status(job)
    assert st.zone == ZONES[1] and [m.zone for m in st.members] == [ZONES[1]] * 2
    assert controller.sim.max_live(job) == 2 and not _zones_overlap(controller, job)
    _beat_all(controller, job)
    g = _generation(controller, job, 2)
    assert set(g["members"]) == {n["name"] for n in controller.live(job)}


def test_every_member_exiting_zero_ends_the_job_and_deletes_every_node(controller):
    job, _ = _placed(controller, _spec("fin", nodes=2))
    controller.heartbeat("fin-1", state="exited", exit_code=0, generation=1, committed_step=90, total_steps=100)
    assert controller.sweep() == 200
    assert controller.status(job).state.value == "RUNNING"  # one member done, the last step not committed: not yet
    controller.heartbeat("fin-2", state="exited", exit_code=0, generation=1)
    assert controller.sweep() == 200
    controller.wait_state(job, "SUCCEEDED")
    _swept_until(controller, lambda: not controller.live(job), timeout=20, what="every node deleted")


def test_a_member_done_with_the_last_step_committed_ends_the_job_whatever_the_generation(controller):
    # The trainers of a smaller generation finished the run while a newer generation (a replacement joined) was
    # being formed: the committed last step is the job's end; the other members must not wait for a world that
    # will never be complete.
    job, _ = _placed(controller, _spec("end", nodes=2))
    controller.heartbeat("end-1", state="exited", exit_code=0, generation=1, committed_step=100, total_steps=100)
    assert controller.sweep() == 200
    controller.wait_state(job, "SUCCEEDED")
    _swept_until(controller, lambda: not controller.live(job), timeout=20, what="every node deleted")


def test_a_crash_in_every_member_restarts_the_generation_and_counts(controller):
    job, _ = _placed(controller, _spec("crs", nodes=2))
    _beat_all(controller, job, state="waiting", generation=1, exit_code=3)
    g2 = _generation(controller, job, 2)
    assert g2["members"] == ["crs-1", "crs-2"]
    st = controller.status(job)
    assert (st.restarts, st.last_cause) == (1, "trainer_crashed")
    assert [a["type"] for a in controller.alerts(want=1)] == ["crashed"]


def test_crash_between_recording_a_member_and_creating_it_makes_no_second_node(controller):
    job = controller.register(_spec("crm", nodes=2))
    controller.sim.set_api_faults(count=1, methods=("insert",), nodes=("crm-2",))  # slot 1's create dies
    assert controller.job_created(job) == 500
    assert controller.job_created(job) == 200  # the redelivery re-issues the same create
    _swept_until(controller, lambda: len(controller.live(job)) == 2, timeout=30,
                 what="both members")
    assert [m.node for m in controller.status(job).members] == ["crm-1", "crm-2"]
    assert len(controller.sim.history()) == 2 and controller.sim.max_live(job) == 2


def test_duplicate_preemption_events_replace_the_member_once(controller):
    job, _ = _placed(controller, _spec("dup", nodes=2))
    controller.sim.preempt(ZONES[0], "dup-2")
    entry = controller.wait_system_event("dup-2")
    assert controller.concurrently([lambda: controller.log_event(entry)] * 3) == [200, 200, 200]
    _swept_until(controller, lambda: len(controller.live(job)) == 2, timeout=30,
                 what="the replacement")
    st = controller.status(job)
    assert [m.node for m in st.members] == ["dup-1", "dup-3"] and st.restarts == 1
    assert controller.sim.max_live(job) == 2 and len(controller.sim.history()) == 3
    # Reordered: the old event arrives once more after the replacement runs; it names a node the job has left.
    assert controller.log_event(entry) == 200
    after = controller.status(job)
    assert [m.node for m in after.members] == ["dup-1", "dup-3"] and after.restarts == 1
    assert len(controller.sim.history()) == 3


def test_a_dropped_event_is_caught_by_the_sweep_and_the_member_replaced(controller):
    job, _ = _placed(controller, _spec("drp", nodes=2))
    controller.sim.preempt(ZONES[0], "drp-2")
    controller.wait_system_event("drp-2")  # the event happened; it is never delivered
    _swept_until(controller, lambda: "drp-3" in {n["name"] for n in controller.live(job)},
                 timeout=30, what="the sweep's replacement")
    assert [m.node for m in controller.status(job).members] == ["drp-1", "drp-3"]
    assert controller.sim.max_live(job) == 2


def test_crash_after_a_member_create_adopts_it_through_409(controller):
    job = controller.register(_spec("c409", nodes=2))
    controller.sim.set_api_faults(count=1, methods=("insert",), nodes=("c409-2",), after=True)  # the reply is lost
    assert controller.job_created(job) == 500  # slot 1's VM exists, its outcome was never recorded
    assert controller.status(job).members[1].create_state == "pending"
    assert controller.job_created(job) == 200  # the redelivery's create meets 409 and adopts it
    _swept_until(controller, lambda: controller.status(job).members[1].create_state
                 == "created", timeout=30, what="slot 1 adopted")
    assert len(controller.sim.history()) == 2 and controller.sim.max_live(job) == 2


def test_a_503_on_a_member_create_is_retried_by_redelivery_without_a_second_vm(controller):
    job = controller.register(_spec("e503", nodes=2))
    controller.sim.set_api_faults(count=2, status=503, methods=("insert",))
    codes = [controller.job_created(job) for _ in range(4)]
    assert codes[0] == 500 and codes[-1] == 200, codes
    _swept_until(controller, lambda: len(controller.live(job)) == 2, timeout=30,
                 what="both members")
    assert [m.node for m in controller.status(job).members] == ["e503-1", "e503-2"]
    assert len(controller.sim.history()) == 2


def test_every_zone_stocked_out_waits_then_places_every_member_in_one_zone(controller):
    for zone in ZONES:
        controller.sim.set_capacity(zone, T4, 0)
    job = controller.register(_spec("dry", nodes=2))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "WAITING_FOR_CAPACITY")
    assert not controller.live(job) and [m.state.value for m in st.members] == ["WAITING_FOR_CAPACITY", "PENDING"]
    controller.sim.set_capacity(ZONES[1], T4, None)
    _swept_until(controller, lambda: len(controller.live(job)) == 2, timeout=40,
                 what="both members once capacity returns")
    assert {n["zone"] for n in controller.live(job)} == {ZONES[1]} and not _zones_overlap(controller, job)


def test_a_warm_spare_takes_a_preempted_members_place_without_waiting_for_its_replacement(controller):
    spec = _spec("spr", nodes=2, spare_nodes=1)
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    controller.sim.wait_for(lambda: all(_members(controller, job)) and len(controller.live(job)) == 3
                            and all(n["status"] == "RUNNING" for n in controller.live(job)), timeout=30,
                            what="spr's 2 nodes and its spare running")
    assert controller.sweep() == 200
    _beat_all(controller, job)
    g1 = _generation(controller, job, 1)
    assert g1["members"] == ["spr-1", "spr-2"]  # the lowest slots; spr-3 is the spare, named by no generation
    live = {n["name"]: n for n in controller.live(job)}
    assert live["spr-3"]["attributes"][ATTR_GENERATION] == "" and live["spr-3"]["labels"][LABEL_SLOT] == "2"

    for node in g1["members"]:
        controller.heartbeat(node, state="training", generation=1)
    controller.sim.preempt(ZONES[0], "spr-2")
    assert controller.log_event(controller.wait_system_event("spr-2")) == 200
    controller.heartbeat("spr-1", state="waiting", generation=1, exit_code=75)
    # The spare joins now; slot 1's replacement (spr-4) is made meanwhile and never beats in this test.
    g2 = _generation(controller, job, 2)
    assert g2["members"] == ["spr-1", "spr-3"] and g2["master_addr"] == g1["master_addr"]
    controller.sim.wait_for(lambda: controller.sim.status_of(ZONES[0], "spr-4") == "RUNNING", timeout=30,
                            what="slot 1's replacement spr-4 running")
    live = {n["name"]: n for n in controller.live(job)}
    assert sorted(live) == ["spr-1", "spr-3", "spr-4"] and live["spr-4"]["labels"][LABEL_SLOT] == "1"
    assert live["spr-4"]["attributes"][ATTR_GENERATION] == ""  # the next spare
    controller.heartbeat("spr-4", state="waiting")
    for node in g2["members"]:
        controller.heartbeat(node, state="training", generation=2)
    _swept_until(controller, lambda: not controller.status(job).recovering, 30, "spr recovered")
    st = controller.status(job)
    assert (st.state.value, st.generation["number"], st.restarts) == ("RUNNING", 2, 1)
    assert controller.sim.max_live(job) == 3 and not _zones_overlap(controller, job)
