"""The node agent's peer server (node_agent/peers.py): only files a committed step's manifest lists, by ranges,
nothing else under any spelling of a path; the trainer's ENV_PEERS in a generation; the member's address from the
metadata server; a real member agent serving its node's checkpoints."""

from __future__ import annotations

import http.client
import json
import os

import numpy as np
import pytest

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (agent_env: a fixture)
from respawn import contract
from respawn.agent.config import load_config
from respawn.agent.metadata import MetadataClient
from respawn.agent.peers import PeerServer, committed_file, listen_port, peers_env
from respawn.ckpt import format as fmt
from respawn.ckpt.serialize import flatten
from sim.emulators import free_port
from sim.metadata import MetadataServer


def committed_steps(root) -> dict:
    """Step 1 committed, step 2 written without its marker; {step: manifest}."""
    out = {}
    for step in (1, 2):
        arrays = {"w": np.arange(50_000, dtype=np.float32) + step}
        out[step] = fmt.write_checkpoint(str(root), step, "periodic", flatten(arrays, copy=False),
                                         shard_bytes=64 << 10)
    os.remove(root / fmt.step_dirname(2) / fmt.MARKER)
    return out


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "checkpoints"
    manifests = committed_steps(root)
    server = PeerServer(str(root), "127.0.0.1", 0).start()
    yield root, manifests, server
    server.stop()


def get(server: PeerServer, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_only_files_a_committed_manifest_lists_are_named(tmp_path):
    root = tmp_path / "checkpoints"
    manifests = committed_steps(root)
    one = "/" + fmt.step_dirname(1)
    assert len(manifests[1]["files"]) > 2
    for name in manifests[1]["files"]:
        assert committed_file(str(root), f"{one}/{name}") == str(root / fmt.step_dirname(1) / name)
    (root / fmt.step_dirname(1) / "extra.bin").write_bytes(b"x")
    os.symlink("/etc/passwd", root / "step_000000000009")
    for path in [f"{one}/{fmt.MANIFEST}", f"{one}/{fmt.MARKER}", f"{one}/extra.bin", f"{one}/",  one, "/",
                 f"/{fmt.step_dirname(2)}/data-00000.bin",  # uncommitted
                 f"/{fmt.step_dirname(3)}/data-00000.bin",  # unknown
                 f"{one}/../{fmt.step_dirname(1)}/data-00000.bin", f"/../{fmt.step_dirname(1)}/data-00000.bin",
                 f"{one}/%2e%2e/{fmt.step_dirname(1)}/data-00000.bin", f"{one}/data-00000.bin/..",
                 f"//{fmt.step_dirname(1)}/data-00000.bin", f"{one}//data-00000.bin", "/step_1/data-00000.bin",
                 f"{one}/data-00000.bin/x", "/etc/passwd", "/step_000000000009/passwd", "../../etc/passwd"]:
        assert committed_file(str(root), path) is None, path


def test_ranges_of_a_committed_step_and_404_for_the_rest(served, capfd):
    root, manifests, server = served
    name = "data-00000.bin"
    whole = (root / fmt.step_dirname(1) / name).read_bytes()
    path = f"/{fmt.step_dirname(1)}/{name}"
    status, headers, body = get(server, path)
    assert (status, body) == (200, whole) and headers["content-length"] == str(len(whole))
    status, headers, body = get(server, path, {"Range": "bytes=100-4195"})
    assert (status, body, headers["content-range"]) == (206, whole[100:4196], f"bytes 100-4195/{len(whole)}")
    assert get(server, path, {"Range": f"bytes={len(whole) - 10}-"})[2] == whole[-10:]
    assert get(server, path, {"Range": f"bytes=0-{len(whole) + 99}"})[2] == whole  # clipped to the file
    assert get(server, path, {"Range": f"bytes={len(whole)}-"})[0] == 416
    assert get(server, path, {"Range": "bytes=0-1,5-9"})[0] == 400
    assert get(server, path, {"Range": "lines=1-2"})[0] == 400
    for bad in (f"/{fmt.step_dirname(2)}/{name}", f"/{fmt.step_dirname(1)}/{fmt.MANIFEST}",
                f"/{fmt.step_dirname(1)}/../{fmt.step_dirname(1)}/{name}", "/etc/passwd"):
        assert get(server, bad)[0] == 404, bad
    # Several requests on one keep-alive connection, as the trainer's readers send them.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for start in range(0, 40_000, 10_000):
        conn.request("GET", path, headers={"Range": f"bytes={start}-{start + 9_999}"})
        assert conn.getresponse().read() == whole[start:start + 10_000]
    conn.close()
    lines = [json.loads(x) for x in capfd.readouterr().out.splitlines() if x.startswith("{")]
    assert [e["step"] for e in lines if e["message"] == "serving a committed step to a peer"] == \
        [fmt.step_dirname(1)], "one line per step and reader"


def test_a_file_the_manifest_lists_that_is_a_link_is_not_followed(served):
    root, manifests, server = served
    target = root / fmt.step_dirname(1) / "data-00000.bin"
    target.unlink()
    os.symlink("/etc/hostname", target)
    assert get(server, f"/{fmt.step_dirname(1)}/data-00000.bin")[0] == 404


def test_the_trainer_asks_the_master_and_the_master_asks_no_one():
    g = contract.Generation(4, ("job-3", "job-7", "job-9"), "10.0.0.3")
    assert peers_env(g, "job-3", 29400) == {contract.ENV_PEERS: ""}
    assert peers_env(g, "job-9", 29400) == {contract.ENV_PEERS: "10.0.0.3:29400"}
    assert contract.parse_peers(peers_env(g, "job-7", 1234)[contract.ENV_PEERS]) == [("10.0.0.3", 1234)]
    v6 = contract.Generation(1, ("a", "b"), "fd00::3")
    assert contract.parse_peers(peers_env(v6, "b", 29400)[contract.ENV_PEERS]) == [("fd00::3", 29400)]
    assert contract.parse_peers(" 10.0.0.1:1, ,10.0.0.2:2 ") == [("10.0.0.1", 1), ("10.0.0.2", 2)]
    for bad in ("10.0.0.1", "10.0.0.1:", ":80", "10.0.0.1:0", "10.0.0.1:70000", "10.0.0.1:http"):
        with pytest.raises(ValueError, match="RESPAWN_PEERS"):
            contract.parse_peers(bad)
    assert listen_port({}) == contract.PEER_PORT == 29400
    assert listen_port({contract.ENV_PEER_PORT: "4321"}) == 4321
    assert contract.PEER_PORT < contract.TORCHRUN_MASTER_PORT, "no generation's rendezvous port may take it"


def test_a_member_reads_its_address_and_a_single_node_does_not(tmp_path):
    s = settings(["true"], f"file://{tmp_path}/store")
    member = MetadataServer(name="m-1", address="10.9.8.7",
                            attributes={**attributes("m", 1, "p", s), contract.ATTR_GENERATION: ""}).start()
    single = MetadataServer(name="s-1", address="10.9.8.6", attributes=attributes("s", 1, "p", s)).start()
    try:
        assert load_config(MetadataClient(member.host), node_dir=str(tmp_path)).address == "10.9.8.7"
        assert load_config(MetadataClient(single.host), node_dir=str(tmp_path)).address is None
    finally:
        member.stop()
        single.stop()


def test_a_member_agent_serves_its_committed_checkpoints(agent_env, tmp_path):
    node_dir = tmp_path / "mp-1"
    manifests = committed_steps(node_dir / contract.LOCAL_CHECKPOINT_DIR)
    port = free_port()
    s = settings(["python3", str(agent_env.tiny_trainer)], f"file://{tmp_path}/store")
    md = agent_env.metadata("mp-1", {**attributes("mp", 1, agent_env.project, s), contract.ATTR_GENERATION: ""})
    agent = agent_env.agent(md, node_dir, RESPAWN_PEER_PORT=str(port))
    wait_for(lambda: agent.has("serving committed checkpoints to the job's other nodes"), 60, "the peer server")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    name = next(n for n in manifests[1]["files"] if n != fmt.SKELETON)
    conn.request("GET", f"/{fmt.step_dirname(1)}/{name}", headers={"Range": "bytes=0-99"})
    r = conn.getresponse()
    assert r.status == 206
    assert r.read() == (node_dir / contract.LOCAL_CHECKPOINT_DIR / fmt.step_dirname(1) / name).read_bytes()[:100]
    conn.request("GET", f"/{fmt.step_dirname(2)}/{name}")
    assert conn.getresponse().status == 404
    conn.close()
