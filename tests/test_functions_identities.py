"""Each job's nodes run as one identity of the deployment's pool, granted that job's checkpoint folder only
(respawn.control.identities): through the entry points, against the sim (Compute Engine, and Cloud Storage's managed
folders) and the Firestore emulator."""

from __future__ import annotations

import json

import pytest

from functions_fixtures import controller, gpu_spec  # noqa: F401 - fixtures
from respawn import deployment
from respawn.schema import IDENTITIES
from sim_fixtures import sim_factory, sim_server  # noqa: F401 - fixtures

POOL = [deployment.service_account_email(a, "p") for a in deployment.node_identities(2)]
ROLE_SUFFIX = f"/roles/{deployment.JOB_DATA_ROLE}"


@pytest.fixture
def pooled(controller, monkeypatch, firestore_emulator):
    from sim import emulators

    emulators.reset_firestore(firestore_emulator, controller.project,
                              tuple(deployment.heartbeat_database(i) for i in POOL))
    monkeypatch.setenv(deployment.ENV_NODE_IDENTITIES, ",".join(POOL))
    monkeypatch.setenv("RESPAWN_STORAGE_ENDPOINT", controller.sim.endpoint)
    return controller


def _start(ctl, job_id: str) -> str:
    """Register and hand the job to on_job_created; the identity its node runs as."""
    job = ctl.register(gpu_spec(job_id, checkpoint_uri=f"gs://ckpt/runs/{job_id}", termination_action="DELETE"))
    assert ctl.job_created(job) == 200
    ctl.wait_state(job, "RUNNING")
    [node] = ctl.live(job)
    return node["service_account"]


def _may(ctl, identity: str, obj: str) -> bool:
    role = f"projects/{ctl.project}{ROLE_SUFFIX}"
    return ctl.sim.storage_folders.may(f"serviceAccount:{identity}", role, "ckpt", obj)


def test_two_jobs_run_as_two_identities_each_granted_its_own_folder_only(pooled):
    a, b = _start(pooled, "job-a"), _start(pooled, "job-b")
    assert {a, b} == set(POOL)
    assert _may(pooled, a, "runs/job-a/step-1/rank-0") and not _may(pooled, a, "runs/job-b/step-1/rank-0")
    assert _may(pooled, b, "runs/job-b/step-1/rank-0") and not _may(pooled, b, "runs/job-a/step-1/rank-0")
    # A replacement (a new VM in another zone) keeps the job's identity, and its folder.
    st = pooled.status("job-a")
    pooled.sim.preempt(st.zone, st.node)
    assert pooled.log_event(pooled.wait_system_event(st.node)) == 200
    st = pooled.wait_state("job-a", "RUNNING")
    assert st.attempt == 2 and [n["service_account"] for n in pooled.live("job-a")] == [a]


def test_a_job_waits_for_an_identity_and_takes_one_only_when_its_holder_has_no_node_left(pooled):
    a, _ = _start(pooled, "job-a"), _start(pooled, "job-b")
    job = pooled.register(gpu_spec("job-c", checkpoint_uri="gs://ckpt/runs/job-c"))
    assert pooled.job_created(job) != 200  # every identity is held: the delivery is retried, no node is made
    assert pooled.sim.max_live(job) == 0
    pooled.cancel("job-a")
    assert pooled.sweep("job-a") == 200
    pooled.wait_state("job-a", "CANCELLED")
    assert pooled.job_created(job) == 200  # the retried delivery: job-a is over and its node gone
    pooled.wait_state(job, "RUNNING")
    assert [n["service_account"] for n in pooled.live(job)] == [a]
    assert _may(pooled, a, "runs/job-c/x") and not _may(pooled, a, "runs/job-a/x")  # job-a's grant went with it
    leases = {d.id: d.to_dict()["job_id"] for d in pooled.db.collection(IDENTITIES).stream()}
    assert leases == {a: "job-c", POOL[1] if a == POOL[0] else POOL[0]: "job-b"}


def test_concurrent_deliveries_for_one_job_agree_on_one_identity(pooled):
    job = pooled.register(gpu_spec("job-a", checkpoint_uri="gs://ckpt/runs/job-a"))
    assert pooled.concurrently([lambda: pooled.job_created(job)] * 3) == [200] * 3
    pooled.wait_state(job, "RUNNING")
    leases = [d.to_dict()["job_id"] for d in pooled.db.collection(IDENTITIES).stream()]
    assert leases == ["job-a"]
    assert len({n["service_account"] for n in pooled.live(job)}) == 1


def test_a_jobs_heartbeats_are_read_from_its_identitys_database_alone(pooled):
    a = _start(pooled, "job-a")
    other = next(i for i in POOL if i != a)
    st = pooled.status("job-a")
    # The node's settings name its identity's database, where the agent writes.
    [node] = pooled.live("job-a")
    assert json.loads(node["attributes"]["respawn-settings"])["heartbeat_database"] == deployment.heartbeat_database(a)
    # A heartbeat for job-a's node written where another identity's nodes write (a forgery) is not read.
    pooled.heartbeat(st.node, step=70, committed_step=60, database=deployment.heartbeat_database(other))
    assert pooled.sweep("job-a") == 200
    assert pooled.status("job-a").last_committed_step is None
    pooled.heartbeat(st.node, step=12, committed_step=10, database=deployment.heartbeat_database(a))
    assert pooled.sweep("job-a") == 200
    assert pooled.status("job-a").last_committed_step == 10


def test_a_checkpoint_bucket_the_controller_may_not_grant_fails_the_job_naming_it(pooled):
    pooled.sim.storage_folders.forbid("other-team")
    job = pooled.register(gpu_spec("job-x", checkpoint_uri="gs://other-team/runs/x"))
    assert pooled.job_created(job) == 200
    st = pooled.wait_state(job, "FAILED")
    assert "other-team" in st.message and "storage.managedFolders.create" in st.message, st.message
    assert pooled.sim.max_live(job) == 0  # no node ever ran without its folder
