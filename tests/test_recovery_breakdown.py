"""Where a recovery's time went, in the recovered alert (issue #27 item 2): decide.recovery_stages from the slot's
recorded times and the replacement's heartbeat, and its Slack text. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from respawn.control import alerts
from respawn.control import decide as core
from test_decide_table import NOW, hb, obs


def test_the_recovered_alert_says_what_the_recovery_cost_stage_by_stage():
    lost = NOW - timedelta(seconds=250)
    o = obs("RUNNING", recovering=True, preempted_at=lost, last_cause="preempted",
            node_started_at=lost + timedelta(seconds=52), running_at=lost + timedelta(seconds=52 + 40),
            heartbeat="fresh")
    beat = hb(step=120, committed_step=100, started_at=lost + timedelta(seconds=152), first_step=101,
              first_step_at=lost + timedelta(seconds=190))
    d = core.decide(replace(o, heartbeat=beat))
    assert d.alert["type"] == "recovered"
    assert d.alert["stages"] == {"waiting_for_capacity": 52.0, "vm_create_and_boot": 40.0, "setup": 60.0,
                                 "restore_and_first_step": 38.0}
    # The stages add up to the recovery's time (recovery_time), told as every renderer tells it.
    assert d.alert["recovery_seconds"] == 190.0 == sum(d.alert["stages"].values())
    assert d.alert["message"].endswith("; this preemption cost 190.0 s: 52.0 s waiting for capacity, 40.0 s VM create "
                                       "and boot, 60.0 s agent and setup, 38.0 s trainer start, restore and first step")
    assert "this preemption cost 190.0 s" in alerts.to_slack(d.alert)["text"]


def test_stages_whose_ends_are_unknown_or_before_the_loss_are_left_out_and_every_part_is_named():
    lost = NOW - timedelta(seconds=30)
    s = obs("RUNNING", recovering=True, preempted_at=lost, node_started_at=NOW - timedelta(hours=2),
            running_at=None).status
    beat = hb(step=5, started_at=lost + timedelta(seconds=20))
    assert core.recovery_stages(s, beat, NOW) == {"setup": 20.0, "restore_and_first_step": 10.0}
    assert core.recovery_stages(s.model_copy(update={"preempted_at": None}), beat, NOW) == {}
    assert alerts.breakdown_text("run_ended", {"setup": 20.0, "restore_and_first_step": 0.4}, 20.4) == (
        "this planned stop cost 20.4 s: 20.0 s agent and setup, 0.4 s trainer start, restore and first step")
