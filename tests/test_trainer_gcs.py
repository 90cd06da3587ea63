"""gs:// checkpoints against the real GCS emulator (gcp-storage-emulator): upload, restore from the bucket alone,
fallback past a corrupt remote checkpoint, local-first emergency saves and upload_pending, remote retention."""

from __future__ import annotations

import numpy as np

from respawn.ckpt import CheckpointManager, SaveState, read_status, upload_pending
from respawn.ckpt import format as fmt
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401 - fixtures

PREFIX = "jobs/gcs-test"


def state(seed, mb=0.5):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(int(mb * (1 << 20)) // 8), "meta": {"seed": seed}}


def mgr(tmp_path, local, uri, **kw):
    kw.setdefault("shard_bytes", 128 << 10)  # many objects: exercises the parallel transfers
    return CheckpointManager(uri, str(tmp_path / local), status_file=str(tmp_path / f"{local}.status"), **kw)


def remote_steps(client, prefix):
    names = [b.name for b in client.list_blobs(BUCKET, prefix=prefix + "/")]
    out = {}
    for n in names:
        d, f = n[len(prefix) + 1:].split("/", 1)
        out.setdefault(fmt.parse_step(d), set()).add(f)
    return out


def test_save_upload_and_restore_from_bucket_only(gcs, tmp_path):
    uri = f"gs://{BUCKET}/{PREFIX}/a"
    m = mgr(tmp_path, "node1", uri)
    m.save(5, state(5), blocking=True)
    steps = remote_steps(gcs, f"{PREFIX}/a")
    assert fmt.MARKER in steps[5] and fmt.MANIFEST in steps[5] and sum(f.startswith("data-") for f in steps[5]) > 2
    assert read_status(str(tmp_path / "node1.status"))["committed_durable"] == "remote"
    # A new node: empty local disk, everything comes from the bucket.
    step, restored = mgr(tmp_path, "node2", uri).restore()
    assert step == 5 and restored["w"].tobytes() == state(5)["w"].tobytes()


def test_restore_falls_back_past_corrupt_remote_object(gcs, tmp_path):
    uri = f"gs://{BUCKET}/{PREFIX}/b"
    m = mgr(tmp_path, "node1", uri)
    m.save(1, state(1), blocking=True)
    m.save(2, state(2), blocking=True)
    blob = gcs.bucket(BUCKET).blob(f"{PREFIX}/b/{fmt.step_dirname(2)}/data-00001.bin")
    data = bytearray(blob.download_as_bytes())
    data[10] ^= 0xFF
    blob.upload_from_string(bytes(data))
    step, restored = mgr(tmp_path, "node2", uri).restore()
    assert step == 1 and restored["w"].tobytes() == state(1)["w"].tobytes()


def test_emergency_lands_locally_when_upload_fails_then_upload_pending(gcs, tmp_path):
    uri = f"gs://{BUCKET}-later/{PREFIX}/c"  # the bucket does not exist yet: every upload fails
    m = mgr(tmp_path, "node1", uri, notice_budget_s=20)
    m.request_preemption("test")
    outcome = m.emergency_save(7, state(7))
    assert outcome.state == SaveState.COMMITTED and outcome.durable == "local", outcome
    assert outcome.reason.startswith("upload: "), outcome
    st = read_status(str(tmp_path / "node1.status"))
    assert st["committed_step"] == 7 and st["committed_durable"] == "local" and st["committed_kind"] == "emergency"

    gcs.create_bucket(f"{BUCKET}-later")  # the network/bucket is back; the node restarts in place
    assert upload_pending(str(tmp_path / "node1"), uri) == [7]
    assert upload_pending(str(tmp_path / "node1"), uri) == [], "a second call must find nothing left to upload"
    step, restored = mgr(tmp_path, "node2", uri).restore()
    assert step == 7 and restored["w"].tobytes() == state(7)["w"].tobytes()
    manifest = gcs.bucket(f"{BUCKET}-later").blob(f"{PREFIX}/c/{fmt.step_dirname(7)}/{fmt.MANIFEST}")
    import json

    assert json.loads(manifest.download_as_bytes())["durable"] == "remote"


def test_emergency_save_uploads_within_budget(gcs, tmp_path):
    uri = f"gs://{BUCKET}/{PREFIX}/d"
    m = mgr(tmp_path, "node1", uri, notice_budget_s=60)
    m.save(10, state(10), blocking=True)
    m.request_preemption("test")
    outcome = m.emergency_save(13, state(13))
    assert outcome.committed and outcome.durable == "remote" and outcome.reason is None, outcome
    assert fmt.MARKER in remote_steps(gcs, f"{PREFIX}/d")[13]


def test_remote_retention_and_uncommitted_leftovers(gcs, tmp_path):
    uri = f"gs://{BUCKET}/{PREFIX}/e"
    # An upload cut short by an earlier life: data but no marker.
    gcs.bucket(BUCKET).blob(f"{PREFIX}/e/{fmt.step_dirname(3)}/data-00000.bin").upload_from_string(b"torn")
    m = mgr(tmp_path, "node1", uri, keep=2)
    assert m.restore() is None
    for s in (4, 5, 6, 7):
        m.save(s, state(s, 0.1), blocking=True)
    assert sorted(remote_steps(gcs, f"{PREFIX}/e")) == [6, 7]
    assert sorted(s for s, c in m.local.steps().items() if c) == [6, 7]
