"""The cost ledger and the budget through the entry points (issue #27 item 3): a job priced from the Cloud Billing
Catalog that sim/ serves (the real HTTP path of the controller's adapter), stopped by the sweep at its budget with no
event, its node deleted, then resumed with `respawn jobs resume` (the real CLI against the emulators).

The budget test's catalog answer is CONSTRUCTED from the documented SKU shape (respawn.prices.catalog_skus; gcp-facts
§24), with round unit prices so that every figure is checked by hand. The ledger test prices a known job from a
RECORDED answer (tests/fixtures/billing_catalog_a2_recorded.json: three SKUs as the live API returned them)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone

import pytest

from functions_fixtures import controller, gpu_spec  # noqa: F401 - fixtures
from respawn.control.adapters.prices import PRICES
from respawn import prices
from respawn.control import costs
from sim_fixtures import sim_factory, sim_server  # noqa: F401 - fixtures
from test_sim_nodes import GUEST
from tests import respawn_forks

# n1-standard-8 (8 vCPUs, 30 GiB) with one T4 and a 100 GB boot disk, Spot: 8 × 0.01 + 30 × 0.002 + 0.5 + 100 ×
# 0.073 / 730 = $0.65 an hour; on demand 8 × 0.04 + 30 × 0.005 + 1.0 + 0.01 = $1.48 an hour.
RATES = {"cpu:n1:spot": 0.01, "ram:n1:spot": 0.002, "gpu:nvidia-tesla-t4:spot": 0.5,
         "cpu:n1:standard": 0.04, "ram:n1:standard": 0.005, "gpu:nvidia-tesla-t4:standard": 1.0,
         "disk:pd-balanced": 0.073}
SPOT, ON_DEMAND = 0.65, 1.48


def _spec(job_id: str, budget: float) -> dict:
    spec = gpu_spec(job_id, termination_action="DELETE", budget={"max_usd": budget})
    spec["accelerator"]["boot_disk_gb"] = 100
    return spec


_respawn = respawn_forks.respawn  # the CLI's imports paid once, not once a command


def test_priced_from_the_catalog_stopped_by_the_sweep_at_its_budget_and_resumed(controller):
    controller.sim.set_catalog(prices.COMPUTE_SERVICE, prices.catalog_skus(RATES, "us-central1"))
    # $0.65 an hour for the 150 s look-ahead is $0.027: a $0.03 budget runs out within seconds of the start.
    job = controller.register(_spec("capped", 0.03))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    life = st.members[0].billing
    assert (life.node, life.usd_per_hour, life.on_demand_usd_per_hour) == (st.node, pytest.approx(SPOT),
                                                                           pytest.approx(ON_DEMAND))
    today = datetime.now(timezone.utc).date().isoformat()
    assert st.cost.note == f"Cloud Billing Catalog of {today} (us-central1)"
    controller.heartbeat(st.node, step=40, committed_step=30)
    # No event: the sweep alone finds the cap within reach and stops the job, deleting its node as a cancel does.
    # The control plane's clock moves past the moment the spend plus the look-ahead reaches the cap ($0.003 more:
    # 17 s at $0.65 an hour), as if the test had waited for it, sweeping.
    controller.advance(20)
    deadline = time.monotonic() + 30
    while (st := controller.status(job)).state.value != "BUDGET_EXHAUSTED":
        assert time.monotonic() < deadline, st.message
        assert controller.sweep() == 200
        time.sleep(0.5)
    controller.sim.wait_for(lambda: controller.live(job) == [], timeout=30, what="no node of the job left")
    spent, on_demand = costs.spent(st, datetime.now(timezone.utc))
    assert 0 < spent <= 0.03 and spent / on_demand == pytest.approx(SPOT / ON_DEMAND, rel=1e-3)
    alerts = controller.alerts(want=1)
    stop = [a for a in alerts if a["type"] == "budget_exhausted"]
    assert stop and stop[0]["cost_usd"] == pytest.approx(spent) and "respawn jobs resume capped" in stop[0]["message"]
    causes = [e["cause"] for e in controller.events(job)]
    assert causes[-1] == "budget_exhausted" and "budget_raised" not in causes, causes
    # Stopped, it stays stopped: the sweep leaves it (terminal) and a nudge changes nothing.
    assert controller.sweep(job) == 200 and controller.status(job).state.value == "BUDGET_EXHAUSTED"
    # describe and list show the cost; resume refuses a cap the job has spent already, then raises it.
    described = _respawn("jobs", "describe", job, "--project", controller.project, "--json")
    assert described.returncode == 0 and "so_far_usd" in described.stdout and "Cloud Billing Catalog" in described.stdout
    listed = _respawn("jobs", "list", "--project", controller.project)
    assert prices.usd(spent) in listed.stdout, listed.stdout
    refused = _respawn("jobs", "resume", job, "--budget", "0.001", "--project", controller.project)
    assert refused.returncode != 0 and "would stop it again at once" in refused.stderr
    assert [e["cause"] for e in controller.events(job)] == causes  # nothing happened to it while stopped
    resumed = _respawn("jobs", "resume", job, "--budget", "5", "--project", controller.project,
                       "--sweep-topic", controller.sweep_topic)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumes from its newest committed checkpoint" in resumed.stdout
    controller.sweep_relay.drain()  # the CLI's nudge, delivered as the sweep topic's push subscription would
    after = controller.wait_state(job, "RUNNING")
    assert after.attempt == st.attempt + 1 and after.cost.closed_usd == pytest.approx(spent)
    assert len(controller.live(job)) == 1


def test_a_hybrid_job_stopped_at_its_budget_deletes_every_node_in_the_pass_that_stops_it(controller):
    """Issue #34: a 3-node hybrid job stopped at its budget deleted one node a pass, each after the previous one's
    soft-off; the tick's orphan scan got to the last one first. Every node's delete is asked for in the pass that
    commits BUDGET_EXHAUSTED, before any of the nodes is gone, and none is left when that reconcile ends, with no
    tick (no orphan scan) in between. Each node's guest ignores SIGTERM, so each delete's soft-off takes the whole
    grace: deletes asked one pass after another would be that far apart."""
    controller.sim.boot_command, controller.sim.delete_grace = [*GUEST, "--ignore-sigterm"], 5.0
    controller.sim.set_catalog(prices.COMPUTE_SERVICE, prices.catalog_skus(RATES, "us-central1"))
    spec = {**_spec("hybcap", 0.12), "nodes": 3, "on_demand_nodes": 1, "placement": {"cooldown_seconds": 1}}
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    controller.sim.wait_for(lambda: len(controller.live(job)) == 3 and all(n["status"] == "RUNNING"
                                                                          for n in controller.live(job)),
                            timeout=30, what="the job's 3 nodes running")
    # $2.78 an hour for the 150 s look-ahead is $0.116: the $0.12 budget runs out within seconds of the third node.
    deadline = time.monotonic() + 60
    while (st := controller.status(job)).state.value != "BUDGET_EXHAUSTED":
        assert time.monotonic() < deadline, st.message
        began = controller.sim.now()
        assert controller.sweep(job) == 200  # the job's own reconcile: no tick, no orphan scan
        ended = controller.sim.now()  # the last pass's: the one that stopped the job
        time.sleep(0.5)
    assert controller.live(job) == []
    lives = [r for r in controller.sim.history() if r["labels"].get("respawn-job") == job]
    assert sorted(r["name"] for r in lives) == ["hybcap-1", "hybcap-2", "hybcap-3"]
    asked = [min(t for t, state in r["states"] if state in ("PENDING_STOP", "STOPPING")) for r in lives]
    gone = [t for r in lives for t, state in r["states"] if state == "DELETED"]
    assert all(began <= t <= ended for t in asked) and len(gone) == 3 and max(asked) < min(gone), (began, ended,
                                                                                                   lives)


RECORDED = os.path.join(os.path.dirname(__file__), "fixtures", "billing_catalog_a2_recorded.json")


def test_the_ledger_prices_a_known_job_from_a_recorded_catalog_answer(controller):
    """a2-highgpu-1g on demand: 12 vCPUs × $0.031611 + 85 GiB × $0.004237 + one A100 × $2.933908 = $3.673385 an
    hour, the machine type's list price in us-central1 (the Kubernetes cluster autoscaler's GCE price table,
    kubernetes/autoscaler cluster-autoscaler/cloudprovider/gce/gce_price_info.go, lists a2-highgpu-1g at 3.673385);
    the recording has no disk SKU, so the 100 GB boot disk ($0.10 a GiB-month) comes from the offline table, and the
    note says so."""
    with open(RECORDED) as f:
        controller.sim.set_catalog(prices.COMPUTE_SERVICE, json.load(f)["skus"])
    controller.db.collection(PRICES).document("us-central1").delete()  # another test's cached book: read again
    spec = gpu_spec("a2-known", provisioning="standard",
                    accelerator={"kind": "gpu", "machine_type": "a2-highgpu-1g", "boot_disk_gb": 100})
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    hourly = 12 * 0.031611 + 85 * 0.004237 + 2.933908 + 100 * 0.10 / prices.HOURS_PER_MONTH
    life = st.members[0].billing
    assert (life.usd_per_hour, life.on_demand_usd_per_hour) == (pytest.approx(hourly), pytest.approx(hourly))
    today = datetime.now(timezone.utc).date().isoformat()
    assert st.cost.note == (f"Cloud Billing Catalog of {today} (us-central1; disk:pd-balanced from the offline table "
                            f"of {prices.OFFLINE_DATE})")
    # An hour of this life is its price an hour: the ledger's running cost at any moment.
    spent, on_demand = costs.spent(st, life.since + timedelta(hours=1))
    assert spent == pytest.approx(hourly, rel=1e-6) and on_demand == pytest.approx(hourly, rel=1e-6)


def test_a_job_in_a_region_the_catalog_does_not_price_is_priced_from_the_offline_table(controller):
    """The catalog answers with no SKU Respawn prices (what the sim serves unless a test sets one, as in the budget demo
    scenario): the ledger prices the node from the dated offline table, and the note says so (moved down from
    tests/test_demo_scenarios.py)."""
    controller.db.collection(PRICES).document("us-central1").delete()  # another test's cached book: read again
    spec = gpu_spec("offline", accelerator={"kind": "gpu", "machine_type": "g2-standard-8"}, budget={"max_usd": 5})
    job = controller.register(spec)
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    life = st.members[0].billing
    assert 0 < life.usd_per_hour < life.on_demand_usd_per_hour
    assert st.cost.note == f"offline table of {prices.OFFLINE_DATE} (us-central1)", st.cost.note
