"""Respawn's own statistics through the entry points (issue #26 item 4): a refusal, a node obtained, a preemption
and the replacement, each added to capacity/{zone}~{accelerator}.stats by model, as every job reads them."""

from __future__ import annotations

from functions_fixtures import T4, ZONES, controller, gpu_spec  # noqa: F401
from respawn.schema import ZoneStats
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def test_refusals_nodes_and_preemptions_are_counted_per_zone(controller):
    controller.sim.set_capacity(ZONES[0], T4, 0)
    job = controller.register(gpu_spec("counted", termination_action="DELETE"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    assert st.zone == ZONES[1]
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    after = controller.wait_state(job, "RUNNING")
    assert after.node != st.node
    docs = controller.capacity()
    refused = ZoneStats.model_validate(docs[f"{ZONES[0]}~{T4}"]["stats"]["spot"])
    assert (refused.refusals, refused.nodes, refused.preemptions) == (1, 0, 0)
    lost = ZoneStats.model_validate(docs[f"{ZONES[1]}~{T4}"]["stats"]["spot"])
    assert (lost.nodes, lost.lives, lost.preemptions) == (1, 1, 1) and lost.mtbi_seconds > 0
    assert lost.obtain_mean_seconds is not None and lost.obtain_mean_seconds > 0
    replaced = ZoneStats.model_validate(docs[f"{after.zone}~{T4}"]["stats"]["spot"])
    assert replaced.nodes == (1 if after.zone != ZONES[1] else 2)
