"""Multi-node membership (functions/membership.py), pure: which model each slot takes, how a generation is formed
(master: an on-demand member, else the lowest slot; a master that still serves stays), and what a job does with
empty slots (wait for a replacement, continue on the survivors at or above min_nodes, move the whole job when the
zone refused and too few serve — only once the newest checkpoint is remote)."""

from __future__ import annotations

import pytest

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
