"""Restore from a survivor (issue #25 item 3): a replacement reads the newest committed step from a survivor's node
agent (its real peer server, respawn.agent.peers, over HTTP) with the same bytes as from the storage emulator;
a survivor whose copy is corrupt, that lacks the step, or that is down costs a fallback to the store, never a wrong
state. The store stays the truth: its manifest is what every byte is checked against."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from respawn import contract
from respawn.agent.peers import PeerServer
from respawn.ckpt import CheckpointManager
from respawn.ckpt import format as fmt
from trainer_helpers import BUCKET, free_port, gcs, gcs_emulator, ranged_state, small_ranges  # noqa: F401 - fixtures

PREFIX = "jobs/peers-test"


state = ranged_state


def raw(value) -> tuple:
    """A tensor's or array's dtype, shape and bytes: equal only when bit-identical."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), tuple(value.shape), value.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    if isinstance(value, np.ndarray):
        return str(value.dtype), value.shape, value.tobytes()
    return value


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(raw(a[k]) == raw(b[k]) for k in a)


def restored_lines(err: str) -> list[dict]:
    return [e for line in err.splitlines() if line.startswith("{")
            and (e := json.loads(line))["message"] == "restored checkpoint"]


@pytest.fixture
def survivor(gcs, tmp_path, small_ranges):
    """A survivor that committed steps 1 and 2 on its disk and in the store, its agent's peer server serving them:
    (checkpoint URI, the survivor's checkpoint directory, its ENV_PEERS entry)."""
    uri = f"gs://{BUCKET}/{PREFIX}/{tmp_path.name}"
    local = tmp_path / "survivor"
    writer = CheckpointManager(uri, str(local), shard_bytes=256 << 10)
    for s in (1, 2):
        assert writer.save(s, state(s), blocking=True).durable == "remote"
    server = PeerServer(str(local), "127.0.0.1", 0).start()
    yield uri, local, contract.peer_endpoint("127.0.0.1", server.port)
    server.stop()


def replacement(tmp_path, uri: str, name: str, monkeypatch, peers: str | None):
    if peers is None:
        monkeypatch.delenv(contract.ENV_PEERS, raising=False)
    else:
        monkeypatch.setenv(contract.ENV_PEERS, peers)
    return CheckpointManager(uri, str(tmp_path / name)).restore()


def test_a_replacement_restores_the_same_bytes_from_a_survivor_as_from_cloud_storage(
        survivor, gcs, tmp_path, monkeypatch, capfd):
    uri, _, peer = survivor
    step, from_store = replacement(tmp_path, uri, "node2", monkeypatch, None)
    step_peer, from_peer = replacement(tmp_path, uri, "node3", monkeypatch, peer)
    assert step == step_peer == 2
    assert same(from_peer, from_store) and same(from_peer, state(2))
    out = capfd.readouterr()
    assert [e["source"] for e in restored_lines(out.err)] == [uri, f"peer {peer}"]
    served = [e for line in out.out.splitlines() if line.startswith("{")
              and (e := json.loads(line))["message"] == "serving a committed step to a peer"]
    assert [e["step"] for e in served] == [fmt.step_dirname(2)], "one line per step and reader"
    assert not (tmp_path / "node3" / fmt.step_dirname(2)).exists(), "a peer's step is read into memory only"

    # The survivor's bytes really are what the replacement read: with the store's data objects gone (its manifest
    # and marker kept), the store alone cannot restore step 2 (it falls back to step 1), the survivor still can.
    for blob in gcs.list_blobs(BUCKET, prefix=f"{uri[len(f'gs://{BUCKET}/'):]}/{fmt.step_dirname(2)}/"):
        if blob.name.rsplit("/", 1)[1] not in (fmt.MANIFEST, fmt.MARKER):
            blob.delete()
    assert replacement(tmp_path, uri, "node4", monkeypatch, None)[0] == 1
    step, again = replacement(tmp_path, uri, "node5", monkeypatch, peer)
    assert step == 2 and same(again, state(2))


def test_a_corrupt_copy_on_the_survivor_is_rejected_and_the_store_read(survivor, tmp_path, monkeypatch, capfd):
    uri, local, peer = survivor
    data = local / fmt.step_dirname(2) / "data-00000.bin"
    flipped = bytearray(data.read_bytes())
    flipped[3 * (64 << 10) + 5] ^= 0x01  # one bit in the fourth range
    data.write_bytes(bytes(flipped))
    step, restored = replacement(tmp_path, uri, "node2", monkeypatch, peer)
    assert step == 2 and same(restored, state(2))
    err = capfd.readouterr().err
    assert [e["source"] for e in restored_lines(err)] == [uri]
    warned = [json.loads(line) for line in err.splitlines() if "a peer could not serve" in line]
    assert len(warned) == 1 and "data-00000.bin checksum" in warned[0]["reason"], warned


def test_a_survivor_without_the_step_or_down_costs_only_a_fallback(survivor, tmp_path, monkeypatch, capfd):
    uri, local, peer = survivor
    (local / fmt.step_dirname(2) / fmt.MARKER).unlink()  # its copy of step 2 is not committed: not served
    dead = contract.peer_endpoint("127.0.0.1", free_port())  # nothing listens there
    step, restored = replacement(tmp_path, uri, "node2", monkeypatch, f"{dead},{peer}")
    assert step == 2 and same(restored, state(2))
    err = capfd.readouterr().err
    assert [e["source"] for e in restored_lines(err)] == [uri]
    reasons = [json.loads(line)["reason"] for line in err.splitlines() if "a peer could not serve" in line]
    # The peer that is down refused the connection at once (no timeout waited out), the other had no copy: each a
    # fallback to the next source, the store last.
    assert len(reasons) == 2 and "Connection refused" in reasons[0] and "HTTP 404" in reasons[1], reasons


def test_malformed_peers_are_ignored(survivor, tmp_path, monkeypatch, capfd):
    uri, _, _ = survivor
    step, restored = replacement(tmp_path, uri, "node2", monkeypatch, "no-port-here")
    assert step == 2 and same(restored, state(2))
    assert "ignoring the peers" in capfd.readouterr().err
