"""Log retention (issue #27 item 1): the scheduled sweep deletes each job's shipped log chunks older than its
logs.retention_days, once a day per job, from the job's own logs prefix only: the pure choice, then the real
adapter against the Cloud Storage emulator through the JSON API, and a file:/// store as the demo has."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from respawn import contract, deployment, joblogs, schema
from respawn.control.adapters.logstore import LogRetention
from respawn.control.clients import Clients, Endpoints
from respawn.control.handlers import expire_logs
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401  (fixtures)

DAY = 86400.0


def chunk(attempt: int, offset: int) -> str:
    return contract.LogChunk(attempt, f"j-{attempt}", "trainer", offset).name()


def test_only_chunks_past_the_retention_are_expired():
    now = 100 * DAY
    listed = [joblogs.Listed(chunk(1, 0), 5, now - 31 * DAY), joblogs.Listed(chunk(1, 5), 5, now - 29 * DAY),
              joblogs.Listed("000001/j-1/trainer/not-a-chunk.log", 5, now - 90 * DAY)]
    assert joblogs.expired(listed, now, 30) == [chunk(1, 0)]
    assert joblogs.expired(listed, now, 28) == [chunk(1, 0), chunk(1, 5)]


def test_each_job_is_due_on_exactly_one_tick_a_day():
    for job in ("train-1", "llm", "x" * 40):
        ticks = [t for t in range(0, int(DAY), 120) if joblogs.retention_due(job, 1_700_000_000 - 1_700_000_000 % DAY
                                                                             + t, deployment.SWEEP_PERIOD_S)]
        assert len(ticks) == 1, (job, ticks)


def test_the_spec_keeps_logs_30_days_unless_told():
    base = {"id": "j", "zones": ["us-central1-a"], "checkpoint_uri": "gs://my-bucket/j", "trainer": {"command": ["x"]},
            "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}}
    assert schema.parse_spec(base).logs.retention_days == contract.LOG_RETENTION_DAYS == 30
    assert schema.parse_spec({**base, "logs": {"retention_days": 7}}).logs.retention_days == 7
    with pytest.raises(schema.SpecError):
        schema.parse_spec({**base, "logs": {"retention_days": 0}})


def test_the_sweep_deletes_expired_chunks_from_cloud_storage_and_nothing_else(gcs, gcs_emulator):
    """Two chunks written 2 s apart and an old checkpoint object beside them: at the moment the first is past 30
    days and the second not, only the first goes."""
    run = f"runs/keep-{time.monotonic_ns()}"
    bucket = gcs.bucket(BUCKET)
    bucket.blob(f"{run}/step_000000000001/COMMITTED").upload_from_string(b"")
    old = bucket.blob(f"{run}/{contract.LOGS_DIR}/{chunk(1, 0)}")
    old.upload_from_string(b"first\n")
    time.sleep(2)
    bucket.blob(f"{run}/{contract.LOGS_DIR}/{chunk(1, 6)}").upload_from_string(b"second\n")
    old.reload()
    now = old.updated.timestamp() + 30 * DAY + 1
    clients = Clients(Endpoints("respawn-test", storage=gcs_emulator))
    uri = f"gs://{BUCKET}/{run}"
    assert LogRetention(clients).expire(uri, 30, now) == 1
    left = sorted(b.name[len(run) + 1:] for b in gcs.list_blobs(BUCKET, prefix=run + "/"))
    assert left == [f"{contract.LOGS_DIR}/{chunk(1, 6)}", "step_000000000001/COMMITTED"], left
    assert LogRetention(clients).expire(uri, 30, now) == 0  # a second sweep finds nothing more


def test_a_local_store_and_a_job_not_due_today(tmp_path):
    store = tmp_path / "ckpt"
    logs = store / contract.LOGS_DIR
    for name in (chunk(2, 0), chunk(2, 9)):
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_bytes(b"x\n")
    now = time.time() + 40 * DAY
    job = "local"
    jobs = {job: {"spec": {"checkpoint_uri": store.as_uri(), "logs": {"retention_days": 30}}}}
    clients = Clients(Endpoints("respawn-test"))
    expire_logs(SimpleNamespace(store=SimpleNamespace(all_jobs=lambda: jobs),
                                now=lambda: datetime.fromtimestamp(_due(job, now) + 600, timezone.utc)), clients)
    assert len(list(logs.rglob("*.log"))) == 2  # not its tick: untouched
    expire_logs(SimpleNamespace(store=SimpleNamespace(all_jobs=lambda: jobs),
                                now=lambda: datetime.fromtimestamp(_due(job, now), timezone.utc)), clients)
    assert list(logs.rglob("*.log")) == []


def _due(job: str, around: float) -> float:
    """The moment, at or after `around` (within a day), of the tick that expires `job`'s logs."""
    t = around
    while not joblogs.retention_due(job, t, deployment.SWEEP_PERIOD_S):
        t += 60
    return t
