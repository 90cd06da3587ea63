"""A job's goodput reaches Cloud Monitoring (sim/ serves timeSeries.create) when it recovers and when it ends, in
ml-goodput-measurement's metric types; a Monitoring that refuses never holds up a recovery."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from functions_fixtures import controller, gpu_spec  # noqa: F401
from respawn.control import goodput_metrics as gm
from sim_fixtures import sim_factory, sim_server  # noqa: F401


def _recover(controller, job):
    st = controller.wait_state(job, "RUNNING")
    now = datetime.now(timezone.utc)
    controller.heartbeat(st.node, step=40, committed_step=40, first_step=1, first_step_at=now - timedelta(seconds=5),
                         started_at=now - timedelta(seconds=6))
    controller.sim.preempt(st.zone, st.node)
    assert controller.log_event(controller.wait_system_event(st.node)) == 200
    new = controller.wait_state(job, "RUNNING")
    controller.heartbeat(new.node, step=45, committed_step=40, first_step=41, first_step_at=datetime.now(timezone.utc),
                         started_at=datetime.now(timezone.utc))
    assert controller.sweep(job) == 200
    return new


def test_a_recovery_and_the_end_write_the_jobs_goodput(controller):
    job = controller.register(gpu_spec("gp", termination_action="DELETE"))
    assert controller.job_created(job) == 200
    _recover(controller, job)
    series = [s for s in controller.sim.monitoring.series if s["resource"]["labels"]["workload_id"] == job]
    kinds = {(s["metric"]["type"], s["metric"]["labels"].get("goodput_source") or s["metric"]["labels"].get(
        "badput_source")) for s in series}
    assert (gm.GOODPUT_TIME, "TOTAL") in kinds and (gm.BADPUT_TIME, "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION") in kinds
    value = {k: s["points"][0]["value"] for k, s in
             ((s["metric"]["type"] + "/" + str(s["metric"]["labels"].get("badput_source", "")), s) for s in series)}
    assert value[gm.DISRUPTIONS + "/"] == {"int64Value": "1"}
    parts = sum(v["doubleValue"] for k, v in value.items() if k.startswith((gm.GOODPUT_TIME, gm.BADPUT_TIME)))
    assert parts == pytest.approx(value[gm.ELAPSED_TIME + "/"]["doubleValue"], abs=0.01)
    assert series[0]["resource"]["type"] == gm.RESOURCE and series[0]["metric"]["labels"]["accelerator_type"] == (
        "nvidia-tesla-t4")
    before = len(controller.sim.monitoring.series)
    controller.cancel(job)
    assert controller.sweep(job) == 200
    controller.wait_state(job, "CANCELLED")
    assert len(controller.sim.monitoring.series) == before + len(series)  # once more, at its end


def test_a_refusing_monitoring_never_holds_up_a_recovery(controller, monkeypatch):
    monkeypatch.setenv("RESPAWN_MONITORING_ENDPOINT", "http://127.0.0.1:1")  # nothing listens
    job = controller.register(gpu_spec("quiet-gp", termination_action="DELETE"))
    assert controller.job_created(job) == 200
    new = _recover(controller, job)
    assert controller.status(job).attempt == new.attempt == 2
    assert any(e["cause"] == "recovered" for e in controller.events(job))


def test_the_builds_dashboard_charts_what_the_controller_writes():
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).resolve().parent.parent / "deploy/monitoring/goodput-dashboard.json").read_text())
    filters = [t["widget"]["xyChart"]["dataSets"][0]["timeSeriesQuery"]["timeSeriesFilter"]["filter"]
               for t in dash["mosaicLayout"]["tiles"]]
    charted = {re.search(r'metric.type="([^"]+)"', f).group(1) for f in filters}
    assert charted == {gm.GOODPUT_TIME, gm.BADPUT_TIME, gm.ELAPSED_TIME, gm.DISRUPTIONS}
    assert all(f'resource.type="{gm.RESOURCE}"' in f for f in filters)
