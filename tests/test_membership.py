"""Multi-node membership (functions/membership.py), pure: which model each slot takes, how a generation is formed
(master: an on-demand member, else the lowest slot; a master that still serves stays), and what a job does with
empty slots (wait for a replacement, continue on the survivors at or above min_nodes, move the whole job when the
zone refused and too few serve — only once the newest checkpoint is remote)."""

from __future__ import annotations

import pytest

from respawn.contract import Handover
from respawn.control.membership import Generation, SlotView, Step, form_generation, plan, slot_provisioning
from respawn.schema import parse_spec


def spec(**over):
    base = {"id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
            "zones": ["us-central1-a", "us-central1-b"], "trainer": {"command": ["python", "t.py"]},
            "checkpoint_uri": "gs://bucket/job", "nodes": 3}
    base.update(over)
    return parse_spec(base)


HYBRID = spec(on_demand_nodes=1)  # min_nodes defaults to nodes
ELASTIC = spec(min_nodes=2)


def serving(slot, node=None, addr=None, model="spot"):
    return SlotView(slot, node or f"job-{slot + 1}", True, addr or f"10.0.0.{slot + 10}", model)


def booting(slot, node=None):
    return SlotView(slot, node or f"job-{slot + 4}", False)


def empty(slot, refused=False):
    return SlotView(slot, None, False, refused=refused)


def test_slot_models_put_the_on_demand_nodes_first():
    assert [slot_provisioning(HYBRID, s) for s in range(3)] == ["standard", "spot", "spot"]
    assert [slot_provisioning(ELASTIC, s) for s in range(3)] == ["spot"] * 3
    with pytest.raises(ValueError, match="slot 3 is outside 0..2"):
        slot_provisioning(HYBRID, 3)


def test_the_master_is_the_on_demand_member_else_the_lowest_slot():
    gen = form_generation(None, [serving(0, model="spot"), serving(1, model="standard"), serving(2)])
    assert gen == Generation(1, ("job-2", "job-1", "job-3"), "10.0.0.11")
    assert gen.world_size == 3 and gen.node_rank("job-3") == 2
    gen = form_generation(None, [serving(2), serving(0), serving(1)])
    assert gen.members == ("job-1", "job-2", "job-3") and gen.master_addr == "10.0.0.10"
    with pytest.raises(ValueError, match="job-9 is not a member of generation 1"):
        gen.node_rank("job-9")


def test_a_generation_changes_only_with_its_members_and_a_serving_master_stays_master():
    first = form_generation(None, [serving(0), serving(1), serving(2)])
    assert form_generation(first, [serving(2), serving(1), serving(0)]) is first  # same members: no restart
    # Slot 1 lost and replaced (job-5): a new generation, the master and the other survivor keep their ranks.
    second = form_generation(first, [serving(0), serving(1, node="job-5", addr="10.0.0.99"), serving(2)])
    assert second.number == 2 and second.members == ("job-1", "job-5", "job-3")
    # The master's node (slot 0) lost: the lowest surviving slot becomes master.
    third = form_generation(second, [serving(1, node="job-5", addr="10.0.0.99"), serving(2)])
    assert third.number == 3 and third.members == ("job-5", "job-3") and third.master_addr == "10.0.0.99"
    # A replacement for slot 0 returns: the master stays where it is (no needless move of rank 0).
    fourth = form_generation(third, [serving(0, node="job-6"), serving(1, node="job-5", addr="10.0.0.99"), serving(2)])
    assert fourth.members == ("job-5", "job-6", "job-3") and fourth.master_addr == "10.0.0.99"
    assert Generation.from_json(fourth.to_json()) == fourth


def test_no_generation_until_every_member_has_an_address():
    assert form_generation(None, [serving(0), SlotView(1, "job-2", True, None)]) is None
    assert form_generation(None, []) is None


# ---- the plan: a decision table ---------------------------------------------------------------------------------

FIRST = Generation(1, ("job-1", "job-2", "job-3"), "10.0.0.10")


@pytest.mark.parametrize("name, job, slots, step, members", [
    ("all serve", HYBRID, [serving(0), serving(1), serving(2)], Step.RUN, ("job-1", "job-2", "job-3")),
    ("one lost, slot empty: wait for its replacement", HYBRID, [serving(0), empty(1), serving(2)],
     Step.WAIT, ("job-1", "job-2", "job-3")),
    ("replacement booting: wait", HYBRID, [serving(0), booting(1), serving(2)], Step.WAIT, ("job-1", "job-2", "job-3")),
    ("lost node not yet deleted: wait", HYBRID, [serving(0), SlotView(1, "job-2", False), serving(2)],
     Step.WAIT, ("job-1", "job-2", "job-3")),
    ("refused, survivors >= min_nodes: continue on 2 of 3", ELASTIC, [serving(0), empty(1, refused=True), serving(2)],
     Step.RUN, ("job-1", "job-3")),
    ("refused, survivors < min_nodes: move", HYBRID, [serving(0), empty(1, refused=True), serving(2)],
     Step.MOVE, None),
    ("refused, one serving + one booting reach min_nodes 2: wait", ELASTIC,
     [serving(0), empty(1, refused=True), booting(2)], Step.WAIT, ("job-1", "job-2", "job-3")),
    ("refused, one serving + one empty on the way reach min_nodes 2: wait", ELASTIC,
     [serving(0), empty(1, refused=True), empty(2)], Step.WAIT, ("job-1", "job-2", "job-3")),
    ("two refused, one serving < min_nodes 2: move", ELASTIC,
     [serving(0), empty(1, refused=True), empty(2, refused=True)], Step.MOVE, None),
    ("elastic job grows back when the replacement serves", ELASTIC,
     [serving(0), serving(1, node="job-4"), serving(2)], Step.RUN, ("job-1", "job-4", "job-3")),
])
def test_plan(name, job, slots, step, members):
    got = plan(job, slots, FIRST)
    assert got.step is step, (name, got)
    assert (got.generation.members if got.generation else None) == members, (name, got)
    assert got.reason


def test_a_planned_generation_holds_serving_nodes_only_and_at_least_min_nodes():
    import itertools

    kinds = [lambda s: serving(s), lambda s: booting(s), lambda s: empty(s), lambda s: empty(s, refused=True),
             lambda s: SlotView(s, f"job-{s + 7}", False)]
    for job in (HYBRID, ELASTIC):
        for combo in itertools.product(range(len(kinds)), repeat=3):
            slots = [kinds[k](s) for s, k in enumerate(combo)]
            got = plan(job, slots, FIRST)
            if got.step is Step.RUN:
                assert got.generation.world_size >= job.min_nodes
                assert set(got.generation.members) <= {s.node for s in slots if s.serving}


def test_plan_wants_one_view_per_slot():
    with pytest.raises(ValueError, match="one view per slot 0..2"):
        plan(HYBRID, [serving(0), serving(1)], FIRST)


# ---- warm spares: slots beyond `nodes` (spec.spare_nodes) --------------------------------------------------------

SPARED = spec(on_demand_nodes=1, spare_nodes=2)  # 5 slots: 3 members' worth, 2 spares


def test_a_ready_spare_takes_a_lost_members_place_and_never_displaces_a_survivor():
    # Generation 1 of slots 0-2; slots 3 and 4 serve as spares and are named by no generation.
    views = [serving(0), serving(1), serving(2), serving(3), serving(4)]
    first = plan(SPARED, views, None).generation
    assert first.members == ("job-1", "job-2", "job-3") and first.master_addr == "10.0.0.10"
    assert plan(SPARED, views, first).generation is first  # the spares serving change nothing
    # Slot 1's node is lost: slot 3's spare (the lowest) joins at once; survivors keep their ranks.
    lost = [serving(0), empty(1), serving(2), serving(3), serving(4)]
    got = plan(SPARED, lost, first)
    assert got.step is Step.RUN and got.generation.members == ("job-1", "job-3", "job-4")
    # Slot 1's replacement serves later: it is the next spare, the generation stays.
    back = [serving(0), serving(1, node="job-9"), serving(2), serving(3), serving(4)]
    assert plan(SPARED, back, got.generation).generation is got.generation
    # The on-demand master lost: a spare joins and the master moves to the lowest remaining slot.
    master_lost = plan(SPARED, [empty(0), serving(1), serving(2), serving(3), booting(4)], first).generation
    assert master_lost.members == ("job-2", "job-3", "job-4") and master_lost.master_addr == "10.0.0.11"


def test_spares_only_count_once_they_serve():
    # Both spares still booting when a member goes: wait as without spares.
    got = plan(SPARED, [serving(0), empty(1), serving(2), booting(3), booting(4)], FIRST)
    assert got.step is Step.WAIT and got.generation is FIRST
    # The spare chosen (the lowest ready slot) has no address yet: wait for it.
    got = plan(SPARED, [serving(0), empty(1), serving(2), SlotView(3, "job-4", True, None), serving(4)], FIRST)
    assert got.step is Step.WAIT


def test_a_generation_with_a_handover_round_trips():
    g = Generation(3, ("job-1", "job-4"), "10.0.0.10", (Handover("job-2", "2026-11-25T07:00:00+00:00"),))
    assert Generation.from_json(g.to_json()) == g
    assert Generation.from_json(FIRST.to_json()).handover == ()
    with pytest.raises(ValueError, match="handover must be a list"):
        Generation.from_json('{"number": 1, "members": ["a"], "master_addr": "10.0.0.1", "handover": [{"x": 1}]}')


def test_spares_are_gpu_only_and_within_the_node_limit():
    assert SPARED.slots == 5
    with pytest.raises(ValueError, match="a TPU job is one node"):
        parse_spec({"id": "t", "accelerator": {"kind": "tpu", "accelerator_type": "v5litepod-8",
                                               "runtime_version": "v2-alpha-tpuv5-lite"},
                    "zones": ["us-central1-a"], "trainer": {"command": ["python", "t.py"]},
                    "checkpoint_uri": "gs://b/j", "spare_nodes": 1})
    with pytest.raises(ValueError, match="exceed 64"):
        spec(nodes=60, spare_nodes=5)
