"""A flex-start tier through the entry points (issue #26 item 1; what the flex-start-fallback demo scenario showed, moved
down from tests/test_demo_scenarios.py): Spot stocked out in every zone, two refusals in a row move the job to its
flex-start tier at once (Spot's cooldowns do not hold for flex-start), and the agent's run-ending notice gets the next
node made during that notice, back at Spot, in the zone that served: a planned stop, told as `run_ended`, no
preemption counted. Functions Framework, real CloudEvents, the emulators and sim/ through the real Compute client.

The agent's side (it gives itself the run-ending notice before the run's end, saves and stops, and tells the
controller) is tests/test_agent_run_end.py's; the pure core's rows are tests/test_decide_flex_start.py's."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from functions_fixtures import controller, gpu_spec  # noqa: F401
from respawn.contract import NOTICE_RUN_ENDING
from respawn.control import alerts
from sim_fixtures import sim_factory, sim_server  # noqa: F401

ZONES = ["us-central1-a", "us-central1-b"]
G2 = "g2-standard-8"  # flex-start runs accelerator-optimized machine types (gcp-facts §18)
TIERS = [{"model": "spot", "after_refusals": 2}, {"model": "flex-start", "max_run_hours": 0.1667, "wait_minutes": 5}]


def _sweep_until(controller, job: str, done, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not done(st := controller.status(job)):
        assert time.monotonic() < deadline, f"{what}: {st.state.value} ({st.message})"
        assert controller.sweep(job) == 200
        time.sleep(0.2)
    return st


def test_spot_dry_everywhere_flex_start_trains_and_its_run_end_brings_the_job_back_to_spot(controller):
    for zone in ZONES:
        controller.sim.set_capacity(zone, G2, 0, provisioning_model="SPOT")  # flex-start's capacity is there
    job = controller.register(gpu_spec("flexfb", zones=ZONES, accelerator={"kind": "gpu", "machine_type": G2},
                                       provisioning=TIERS, termination_action="DELETE",
                                       placement={"cooldown_seconds": 2}))
    assert controller.job_created(job) == 200
    st = _sweep_until(controller, job, lambda s: s.state.value == "RUNNING", "the flex-start node running")
    flex = st.node
    assert (st.provisioning, st.zone, st.preemptions) == ("flex-start", ZONES[0], 0)
    made = [r for r in controller.sim.history() if r["labels"].get("respawn-job") == job]
    assert [r["provisioningModel"] for r in made][-1] == "FLEX_START"
    steps = [(e["to_state"], e["cause"], e["details"].get("provisioning"), e["details"].get("tier_why"))
             for e in controller.events(job) if e.get("details", {}).get("provisioning")]
    assert steps[:3] == [("PROVISIONING", "job_created", "spot", None), ("PROVISIONING", "zone_refused", "spot", None),
                         ("PROVISIONING", "zone_refused", "flex-start", "spot: refused 2 times in a row")], steps

    # Spot serves again in the first zone, and its cooldown is over (the demo's run lasted minutes, far past the
    # cooldown); the flex-start node's agent acts on its run's end as on a notice.
    controller.sim.set_capacity(ZONES[0], G2, None, provisioning_model="SPOT")
    ends = [r["until"] for r in controller.capacity().values() if isinstance(r.get("until"), datetime)]
    assert ends, controller.capacity()
    controller.sim.wait_for(lambda: datetime.now(timezone.utc) > max(ends), 10, "the Spot cooldowns over")
    controller.heartbeat(flex, step=120, committed_step=100)
    controller.heartbeat(flex, state="preempting", notice=NOTICE_RUN_ENDING, step=120, committed_step=100,
                         emergency={"state": "saving", "step": 120, "reason": None})
    assert controller.notice(job, flex, NOTICE_RUN_ENDING) == 200
    noticed = controller.status(job)
    assert noticed.members[0].leaving.node == flex and noticed.node != flex  # made during the notice
    assert (noticed.provisioning, noticed.zone, noticed.preemptions, noticed.failures) == ("spot", ZONES[0], 0, 0)
    [ended] = [e for e in controller.events(job) if e["cause"] == "run_ended"]
    assert ended["details"]["during_notice"] is True and ended["details"]["provisioning"] == "spot"

    # The flex-start node's save committed; the Spot node resumes there and steps: one recovery, no preemption.
    controller.heartbeat(flex, state="exited", exit_code=75, notice=NOTICE_RUN_ENDING, step=120, committed_step=120,
                         emergency={"state": "committed", "step": 120, "reason": None})
    spot = noticed.node
    controller.wait_state(job, "RUNNING")
    controller.heartbeat(spot, step=122, committed_step=120, first_step=121, started_at=datetime.now(timezone.utc))
    st = _sweep_until(controller, job, lambda s: any(e["cause"] == "recovered" for e in controller.events(job)),
                      "the recovery")
    assert (st.node, st.provisioning, st.zone, st.preemptions, st.restarts) == (spot, "spot", ZONES[0], 0, 1)
    [recovery] = [e["details"] for e in controller.events(job) if e["cause"] == "recovered"]
    assert recovery["recovery_seconds"] > 0 and recovery["steps_lost"] == 0, recovery
    assert "WAITING_FOR_CAPACITY" not in [e["to_state"] for e in controller.events(job)]
    [recovered] = [a for a in controller.alerts(want=1) if a["type"] == "recovered"]
    said = alerts.to_slack(recovered)["text"]
    assert "cause: run_ended" in said and "preemptions: 0" in said, said
