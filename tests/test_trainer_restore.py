"""Restore by ranges (issue #25 item 3): checksums of ranges joined into the file's, the GCS emulator read by ranged
GETs straight into the tensors, a corrupt or short range rejected with the older step used, the format unchanged
(crc32c checkpoints too), and a step restored from the bucket not written again."""

from __future__ import annotations

import itertools
import json
import os
import zlib

import numpy as np
import pytest
import torch
from respawn.ckpt import CheckpointManager, checksum
from respawn.ckpt import format as fmt
from respawn.ckpt.storage import GCSStore
from trainer_helpers import BUCKET, gcs, gcs_emulator, ranged_state, small_ranges  # noqa: F401 - fixtures

PREFIX = "jobs/restore-test"


state = ranged_state


def assert_identical(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert got[key].view(-1).view(torch.uint8).numpy().tobytes() == \
                value.view(-1).view(torch.uint8).numpy().tobytes(), key
        elif isinstance(value, np.ndarray):
            assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key
        else:
            assert got[key] == value, key


def saved(tmp_path, uri: str, steps=(1, 2), **kw) -> CheckpointManager:
    m = CheckpointManager(uri, str(tmp_path / "writer"), shard_bytes=256 << 10, **kw)
    for s in steps:
        assert m.save(s, state(s), blocking=True).durable == "remote"
    return m


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c"])
def test_combined_range_checksums_equal_the_whole_files(algorithm):
    data = os.urandom(1 << 20) + b"tail"
    for cuts in ([], [1], [5, 70_000], [1 << 19, (1 << 19) + 1, 1 << 20]):
        bounds = [0, *cuts, len(data)]
        value = 0
        for a, b in itertools.pairwise(bounds):
            value = checksum.combine(value, int(checksum.of_bytes(data[a:b], algorithm), 16), b - a, algorithm)
        assert f"{value:08x}" == checksum.of_bytes(data, algorithm), cuts
    assert checksum.combine(0x1234, 0, 0, algorithm) == 0x1234  # an empty second piece changes nothing
    if algorithm == "crc32":
        assert checksum.of_bytes(data) == f"{zlib.crc32(data):08x}"


def test_plan_reads_tiles_every_file_in_ranges(tmp_path, small_ranges):
    from respawn.ckpt.serialize import flatten

    manifest = fmt.write_checkpoint(str(tmp_path), 1, "periodic", flatten(state(3), copy=False),
                                    shard_bytes=200 << 10)
    _, ranges = fmt.plan_reads(manifest, fmt.RANGE_BYTES)
    for name, entry in manifest["files"].items():
        if name == fmt.SKELETON:
            continue
        mine = sorted((r.start, r.end) for r in ranges if r.name == name)
        assert mine[0][0] == 0 and mine[-1][1] == entry["size"], name
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine)), name
    assert all(sum(len(v) for v in r.views) == r.end - r.start <= fmt.RANGE_BYTES for r in ranges)
    assert len(ranges) > len(manifest["files"]), "files this size must be read in several ranges"
    data = {name: f["size"] for name, f in manifest["files"].items() if name != fmt.SKELETON}
    assert sorted((r.name, r.start, r.end) for r in fmt.file_ranges(data, fmt.RANGE_BYTES)) == \
        sorted((r.name, r.start, r.end) for r in ranges)  # the download's plan is the restore's


def test_restore_from_bucket_and_from_disk_give_the_saved_bytes(gcs, tmp_path, small_ranges):
    uri = f"gs://{BUCKET}/{PREFIX}/same"
    saved(tmp_path, uri)
    # A fresh node: nothing local, every data file read by ranged GETs into the tensors.
    fresh = CheckpointManager(uri, str(tmp_path / "node2"))
    step, restored = fresh.restore()
    assert step == 2
    assert_identical(restored, state(2))
    assert not fresh.local.steps(), "the restore must not write the state to the local disk"
    # The writer's own disk, read with parallel preads.
    step, local = CheckpointManager(local_dir=str(tmp_path / "writer")).restore()
    assert step == 2
    assert_identical(local, state(2))
    # get_step (the sharded managers' download) leaves a directory that verifies.
    step_dir = GCSStore(uri).get_step(2, str(tmp_path / "dl"))
    assert fmt.verify(step_dir)["step"] == 2
    assert_identical(fmt.load(step_dir), state(2))


def test_a_corrupt_range_is_rejected_and_the_older_step_restored(gcs, tmp_path, small_ranges):
    uri = f"gs://{BUCKET}/{PREFIX}/corrupt"
    saved(tmp_path, uri)
    blob = gcs.bucket(BUCKET).blob(f"{PREFIX}/corrupt/{fmt.step_dirname(2)}/data-00000.bin")
    data = bytearray(blob.download_as_bytes())
    assert len(data) > 3 * fmt.RANGE_BYTES
    data[2 * fmt.RANGE_BYTES + 100] ^= 0x01  # one bit in the third range
    blob.upload_from_string(bytes(data))

    store = GCSStore(uri)
    with pytest.raises(fmt.CorruptCheckpoint, match="data-00000.bin checksum"):
        store.load_step(2)
    with pytest.raises(fmt.CorruptCheckpoint, match="data-00000.bin checksum"):
        store.get_step(2, str(tmp_path / "dl"))
    step, restored = CheckpointManager(uri, str(tmp_path / "node2")).restore()
    assert step == 1
    assert_identical(restored, state(1))


def test_restore_reads_into_the_live_state_where_it_fits(gcs, tmp_path, small_ranges):
    """like=: the saved arrays land in the live state's own tensors and arrays (same place, dtype and shape), so a
    restore holds no second copy of the state; whatever does not fit, and memory two entries share, is new."""
    uri = f"gs://{BUCKET}/{PREFIX}/inplace"
    saved(tmp_path, uri)

    def live():
        tied = torch.zeros(7, 9, dtype=torch.bfloat16)
        return {"w": torch.zeros(300_000), "h": tied, "n": np.zeros(20_000, dtype=np.int64),
                "empty": torch.zeros(0, 3, dtype=torch.float64), "seed": -1, "h_tied": tied}

    for manager in (CheckpointManager(uri, str(tmp_path / "node2")),
                    CheckpointManager(local_dir=str(tmp_path / "writer"))):
        target = live()
        target.pop("h_tied")
        step, restored = manager.restore(like=target)
        assert step == 2
        assert_identical(restored, state(2))
        assert restored["w"] is target["w"] and restored["n"] is target["n"] and restored["h"] is target["h"]
        assert restored["empty"] is not target["empty"], "a float64 tensor cannot hold the saved float32 bytes"
    # Tied memory (one tensor under two names of the live state, one saved name each side): read into new memory.
    target = live()
    target["w"] = target["w"][:-1]  # a shape the saved array does not have: new memory, the live one untouched
    _, restored = CheckpointManager(uri, str(tmp_path / "node3")).restore(like={"h": target["h"], "x": target})
    assert_identical(restored, state(2))
    assert not target["w"].any()


def test_a_corrupt_step_read_into_the_live_state_is_replaced_by_the_older_step(gcs, tmp_path, small_ranges):
    uri = f"gs://{BUCKET}/{PREFIX}/inplace-corrupt"
    saved(tmp_path, uri)
    blob = gcs.bucket(BUCKET).blob(f"{PREFIX}/inplace-corrupt/{fmt.step_dirname(2)}/data-00000.bin")
    data = bytearray(blob.download_as_bytes())
    data[-10] ^= 0x01
    blob.upload_from_string(bytes(data))
    target = {"w": torch.zeros(300_000), "n": np.zeros(20_000, dtype=np.int64)}
    step, restored = CheckpointManager(uri, str(tmp_path / "node2")).restore(like=target)
    assert step == 1
    assert_identical(restored, state(1))
    assert restored["w"] is target["w"]


def test_a_short_object_is_rejected(gcs, tmp_path, small_ranges):
    uri = f"gs://{BUCKET}/{PREFIX}/short"
    saved(tmp_path, uri)
    blob = gcs.bucket(BUCKET).blob(f"{PREFIX}/short/{fmt.step_dirname(2)}/data-00000.bin")
    whole = blob.download_as_bytes()
    blob.upload_from_string(whole[:-1000])
    with pytest.raises(fmt.CorruptCheckpoint, match="shorter than the manifest"):
        GCSStore(uri).load_step(2)
    blob.upload_from_string(whole)
    gcs.bucket(BUCKET).blob(f"{PREFIX}/short/{fmt.step_dirname(2)}/data-00001.bin").delete()
    with pytest.raises(fmt.CorruptCheckpoint, match="missing"):
        GCSStore(uri).get_step(2, str(tmp_path / "dl"))
    step, _ = CheckpointManager(uri, str(tmp_path / "node2")).restore()
    assert step == 1


def test_a_crc32c_checkpoint_restores_by_ranges(gcs, tmp_path, small_ranges):
    """The format is unchanged: a checkpoint written with the other algorithm the manifest may name restores
    whole, from disk and from the bucket."""
    from respawn.ckpt.serialize import flatten

    root = tmp_path / "old"
    manifest = fmt.write_checkpoint(str(root), 4, "periodic", flatten(state(4), copy=False),
                                    shard_bytes=256 << 10, algorithm="crc32c")
    assert manifest["checksum_algorithm"] == "crc32c" and manifest["version"] == 1
    uri = f"gs://{BUCKET}/{PREFIX}/crc32c"
    GCSStore(uri).put_step(str(root / fmt.step_dirname(4)), 4, manifest)
    assert_identical(CheckpointManager(local_dir=str(root)).restore()[1], state(4))
    step, restored = CheckpointManager(uri, str(tmp_path / "node2")).restore()
    assert step == 4
    assert_identical(restored, state(4))


def test_saving_the_step_restored_from_the_bucket_rewrites_nothing(gcs, tmp_path):
    uri = f"gs://{BUCKET}/{PREFIX}/again"
    saved(tmp_path, uri, steps=(3,))
    before = {b.name: b.generation for b in gcs.list_blobs(BUCKET, prefix=f"{PREFIX}/again/")}
    node = CheckpointManager(uri, str(tmp_path / "node2"))
    step, restored = node.restore()
    outcome = node.save(step, restored, blocking=True)
    assert outcome.committed and outcome.durable == "remote"
    node.request_preemption("test")
    assert node.emergency_save(step, restored).durable == "remote"
    after = {b.name: b.generation for b in gcs.list_blobs(BUCKET, prefix=f"{PREFIX}/again/")}
    assert after == before, "a committed remote step was deleted and uploaded again"


def test_prefetch_copies_the_newest_committed_step_to_the_disk_where_restore_then_reads_it(gcs, tmp_path, capsys):
    from respawn.ckpt.manager import prefetch

    uri = f"gs://{BUCKET}/{PREFIX}/prefetch"
    saved(tmp_path, uri)
    node = str(tmp_path / "node")
    assert prefetch(node, uri) == 2  # what the agent runs while setup runs
    assert fmt.verify(os.path.join(node, fmt.step_dirname(2)))["step"] == 2
    assert prefetch(node, uri) is None  # there already
    capsys.readouterr()
    step, restored = CheckpointManager(uri, node).restore()
    assert step == 2
    assert_identical(restored, state(2))
    [line] = [json.loads(x) for x in capsys.readouterr().err.splitlines() if "restored checkpoint" in x]
    assert line["source"] == line["store"] == f"file://{node}"  # the local copy, not the bucket
    assert prefetch(str(tmp_path / "other"), f"file://{tmp_path / 'writer'}") is None  # a disk already
