"""The node agent's pure parts: settings parsing, the watch state machine, heartbeat composition, Firestore value
encoding, status reading, output tails. No servers, no processes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from respawn.agent.config import ConfigError, parse_attempt, parse_settings, zone_from_metadata
from respawn.agent.firestore_rest import encode_value
from respawn.agent.heartbeat import compose_heartbeat
from respawn.agent.metadata import metadata_host
from respawn.agent.supervisor import log_tail, normalize_exit
from respawn.agent.watcher import Backoff, is_preempted, is_terminating_maintenance, maintenance_watch, preempted_watch
from respawn.contract import ATTR_ATTEMPT, ATTR_SETTINGS, HEARTBEAT_FIELDS, NodeState, read_status
from respawn.schema import Heartbeat

GOOD = {"command": ["python", "train.py"], "checkpoint_uri": "gs://bucket/run"}


def test_settings_defaults_and_values():
    s = parse_settings(json.dumps({**GOOD, "env": {"A": "1"}, "heartbeat_seconds": 5, "future_key": True}))
    assert s.command == ("python", "train.py") and s.env == {"A": "1"}
    assert s.heartbeat_seconds == 5 and s.notice_budget_seconds == 25 and s.metadata_wait_seconds == 60


@pytest.mark.parametrize("raw, words", [
    ("not json", "not valid JSON"),
    ("[1]", "JSON object"),
    (json.dumps({**GOOD, "command": "python train.py"}), "argv list"),
    (json.dumps({**GOOD, "command": []}), "argv list"),
    (json.dumps({**GOOD, "checkpoint_uri": "s3://x"}), "checkpoint_uri"),
    (json.dumps({**GOOD, "env": {"A": 1}}), "env"),
    (json.dumps({**GOOD, "notice_budget_seconds": 0}), "notice_budget_seconds"),
    (json.dumps({**GOOD, "heartbeat_seconds": True}), "heartbeat_seconds"),
])
def test_bad_settings_name_the_attribute_and_the_problem(raw, words):
    with pytest.raises(ConfigError) as exc:
        parse_settings(raw)
    assert exc.value.attribute == ATTR_SETTINGS
    assert ATTR_SETTINGS in str(exc.value) and words in str(exc.value)


def test_attempt_and_zone():
    assert parse_attempt(" 7\n") == 7
    for bad in ("0", "x", "-1"):
        with pytest.raises(ConfigError) as exc:
            parse_attempt(bad)
        assert exc.value.attribute == ATTR_ATTEMPT
    assert zone_from_metadata("projects/123456/zones/europe-west4-a") == "europe-west4-a"
    assert zone_from_metadata("us-central1-b") == "us-central1-b"


def test_metadata_host_follows_google_auth():
    assert metadata_host({}) == "metadata.google.internal"
    assert metadata_host({"GCE_METADATA_ROOT": "a:1"}) == "a:1"
    assert metadata_host({"GCE_METADATA_HOST": "b:2", "GCE_METADATA_ROOT": "a:1"}) == "b:2"


def test_notice_values():
    assert is_preempted("TRUE") and is_preempted("true\n") and not is_preempted("FALSE")
    assert is_terminating_maintenance("TERMINATE_ON_HOST_MAINTENANCE")
    assert is_terminating_maintenance("SHUTDOWN_ON_HOST_MAINTENANCE")
    assert not is_terminating_maintenance("MIGRATE_ON_HOST_MAINTENANCE")
    assert not is_terminating_maintenance("NONE")


def test_watch_reads_once_then_waits_on_the_etag():
    w = preempted_watch()
    assert w.wants_plain_read()  # never wait before the first read: the key may already be TRUE
    assert w.on_answer("FALSE", "e1") == (False, True)
    assert not w.wants_plain_read() and w.etag == "e1"
    assert w.on_answer("FALSE", "e1") == (False, False)  # timeout_sec expired, nothing changed
    assert w.on_answer("TRUE", "e2") == (True, True)


def test_watch_without_etag_keeps_reading():
    w = maintenance_watch()
    w.on_answer("NONE", None)
    assert w.wants_plain_read()
    assert w.on_answer("TERMINATE_ON_HOST_MAINTENANCE", None)[0]


def test_backoff_doubles_to_the_cap_and_resets():
    b = Backoff(first=0.1, cap=0.5)
    assert [b.fail() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.ok()
    assert b.fail() == 0.1 and b.failures == 1


STATUS = {"step": 120, "committed_step": 118, "committed_kind": "emergency", "committed_durable": "local",
          "emergency": {"state": "committed", "step": 118, "reason": None}, "total_steps": 1000,
          "updated_at": 1.0, "pid": 42}


def test_heartbeat_from_status_matches_the_schema():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    doc = compose_heartbeat(job_id="j", attempt=3, zone="us-central1-a", state=NodeState.EXITED, status=STATUS,
                            started_at=now, notice="preempted", exit_code=75, now=now)
    assert doc["state"] == NodeState.EXITED and doc["notice"] == "preempted"
    assert (doc["step"], doc["committed_step"], doc["total_steps"]) == (120, 118, 1000)
    assert doc["emergency"] == STATUS["emergency"] and doc["exit_code"] == 75
    assert doc["started_at"] == doc["heartbeat_at"] == now  # datetimes stay datetimes: Firestore timestamps
    assert tuple(doc) == HEARTBEAT_FIELDS
    # The control plane's reading of it (pydantic) takes every value as it is.
    assert Heartbeat.model_validate(doc).model_dump(mode="python") == doc


def test_heartbeat_tolerates_a_missing_or_odd_status():
    doc = compose_heartbeat(job_id="j", attempt=1, zone=None, state=NodeState.STARTING, status=None,
                            started_at=None)
    assert doc["step"] is None and doc["emergency"] is None
    doc = compose_heartbeat(job_id="j", attempt=1, zone=None, state=NodeState.TRAINING,
                            status={"step": "7", "committed_step": True, "emergency": "x"}, started_at=None)
    assert doc["step"] is None and doc["committed_step"] is None and doc["emergency"] is None


def test_read_status_is_tolerant(tmp_path):
    p = tmp_path / "status.json"
    assert read_status(str(p)) is None
    p.write_text('{"step": 1')
    assert read_status(str(p)) is None
    p.write_text("[1, 2]")
    assert read_status(str(p)) is None
    p.write_text(json.dumps(STATUS))
    assert read_status(str(p)) == STATUS


def test_firestore_values():
    t = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc)
    assert encode_value(None) == {"nullValue": None}
    assert encode_value(True) == {"booleanValue": True}
    assert encode_value(12) == {"integerValue": "12"}
    assert encode_value(1.5) == {"doubleValue": 1.5}
    assert encode_value(NodeState.TRAINING) == {"stringValue": "training"}
    assert encode_value(t) == {"timestampValue": "2026-01-02T03:04:05.600000Z"}
    assert encode_value({"a": [1]}) == {"mapValue": {"fields": {"a": {"arrayValue": {"values": [{"integerValue": "1"}]}}}}}
    with pytest.raises(TypeError):
        encode_value(object())


def test_output_tail_keeps_the_last_lines_of_this_run(tmp_path):
    p = tmp_path / "trainer.log"
    p.write_text("old life\n" + "".join(f"line {i}\n" for i in range(100)))
    tail = log_tail(str(p), start=len("old life\n"))
    assert tail.splitlines() == [f"line {i}" for i in range(50, 100)]
    p.write_text("x" * 10 + "\n" + "y" * 9000 + "\n")
    assert len(log_tail(str(p)).encode()) <= 4096
    assert log_tail(str(tmp_path / "missing")) == ""


def test_exit_status_of_a_signalled_process_reads_like_the_shell():
    assert normalize_exit(-9) == 137 and normalize_exit(-15) == 143 and normalize_exit(3) == 3


# ---- multi-host TPU slices: the worker attributes and the heartbeat document per worker --------------------------

# worker-network-endpoints in its two formats (gcp-facts §13): the workers' hostnames, or name:uid:IP triples.
HOSTNAMES = "t1v-n-3f2a9c1e-w-0,t1v-n-3f2a9c1e-w-1,t1v-n-3f2a9c1e-w-2,t1v-n-3f2a9c1e-w-3"
TRIPLES = ("t1v-n-3f2a9c1e-w-0:4720348571130263516:10.0.0.11,t1v-n-3f2a9c1e-w-1:1398205776235100931:10.0.0.12,"
           "t1v-n-3f2a9c1e-w-2:8021447719264403375:10.0.0.13,t1v-n-3f2a9c1e-w-3:2265119930027541863:10.0.0.14")


@pytest.mark.parametrize("endpoints, master", [(HOSTNAMES, "t1v-n-3f2a9c1e-w-0"), (TRIPLES, "10.0.0.11"),
                                               ("10.0.0.11,10.0.0.12,10.0.0.13,10.0.0.14", "10.0.0.11"),
                                               ("w0.us-central2-b.c.p.internal,b,c,d", "w0.us-central2-b.c.p.internal")])
def test_worker_attributes_give_rank_count_and_master(endpoints, master):
    from respawn.agent.config import SINGLE_HOST, Hosts, parse_hosts

    assert parse_hosts("2", endpoints) == Hosts(2, 4, master)
    assert parse_hosts("0\n", " " + endpoints + "\n") == Hosts(0, 4, master)
    # A GPU VM or a node without the attributes; a single-host TPU VM with its index only, or one endpoint in either
    # format: its master is its own loopback, which needs no name resolution.
    assert parse_hosts("", "") == SINGLE_HOST == Hosts(0, 1, "127.0.0.1")
    assert parse_hosts("0", "") == SINGLE_HOST
    assert parse_hosts("0", endpoints.split(",")[0]) == parse_hosts("", endpoints.split(",")[0]) == SINGLE_HOST


@pytest.mark.parametrize("worker, endpoints, attribute, words", [
    ("1", "", "worker-network-endpoints", "cannot find worker 0"),
    ("", "x:y:10.0.0.1,x:y:10.0.0.2", "agent-worker-number", "lists 2 workers"),
    ("2", "x:y:10.0.0.1,x:y:10.0.0.2", "agent-worker-number", "is 2, but"),
    ("-1", "x:y:10.0.0.1", "agent-worker-number", "non-negative integer"),
    ("one", "x:y:10.0.0.1", "agent-worker-number", "'one'"),
    ("1", "x:y:10.0.0.1,x:y:host-b", "worker-network-endpoints", "entry 1 ('x:y:host-b') is neither a hostname "
                                                                  "nor name:uid:IP"),
    ("0", "x:y:10.0.0.1,", "worker-network-endpoints", "entry 1 ('')"),
    ("0", "t1v-n-1-w-0,,t1v-n-1-w-2", "worker-network-endpoints", "entry 1 ('')"),
    ("2", "t1v-n-1-w-0,t1v-n-1-w-1", "agent-worker-number", "is 2, but worker-network-endpoints lists 2"),
    ("0", "t1v-n-1-w-0,host_b", "worker-network-endpoints", "entry 1 ('host_b')"),  # not an RFC 1123 label
    ("0", "t1v-n-1-w-0,-b", "worker-network-endpoints", "entry 1 ('-b')"),
    ("0", "t1v-n-1-w-0,a..b", "worker-network-endpoints", "entry 1 ('a..b')"),
    ("0", "a,b:8470", "worker-network-endpoints", "entry 1 ('b:8470')"),  # two fields: neither format
    ("0", "a:1:10.0.0.1:7", "worker-network-endpoints", "entry 0 ('a:1:10.0.0.1:7')"),
    ("0", ":1:10.0.0.1", "worker-network-endpoints", "entry 0 (':1:10.0.0.1')"),  # a triple names its worker
    ("0", "a:1:10.0.0.1," + "x" * 64, "worker-network-endpoints", "as name:uid:IP triples"),  # a label's 63 at most
])
def test_malformed_worker_attributes_name_the_attribute_and_value(worker, endpoints, attribute, words):
    from respawn.agent.config import parse_hosts

    with pytest.raises(ConfigError) as info:
        parse_hosts(worker, endpoints)
    assert info.value.attribute == attribute
    assert attribute in str(info.value) and words in str(info.value)


def test_heartbeat_document_per_worker():
    from respawn.contract import heartbeat_id, node_name, parse_worker_endpoints
    from sim.tpu import format_worker_endpoints

    node = node_name("llm", 12)
    assert heartbeat_id(node) == heartbeat_id(node, 0) == "llm-12"  # single hosts keep nodes/{node}
    assert heartbeat_id(node, 3) == "llm-12-w3"
    with pytest.raises(ValueError):
        heartbeat_id(node, -1)
    # A worker's id never reads as another node's name ({job}-{digits}), however the job is named.
    assert not heartbeat_id("x-1", 1).rsplit("-", 1)[1].isdigit()
    workers = [("t1v-n-0-w-0", "8812", "127.0.0.2"), ("t1v-n-0-w-1", "9931", "127.0.0.3")]
    assert format_worker_endpoints(workers, "triples") == "t1v-n-0-w-0:8812:127.0.0.2,t1v-n-0-w-1:9931:127.0.0.3"
    assert parse_worker_endpoints(format_worker_endpoints(workers, "triples")) == ["127.0.0.2", "127.0.0.3"]
    assert parse_worker_endpoints(format_worker_endpoints(workers, "hostnames")) == ["t1v-n-0-w-0", "t1v-n-0-w-1"]
    with pytest.raises(ValueError, match="hostnames, triples"):
        format_worker_endpoints(workers, "ips")
    doc = compose_heartbeat(job_id="llm", attempt=12, zone=None, state=NodeState.TRAINING, status=None,
                            started_at=None, worker=3)
    assert doc["worker"] == 3 and tuple(doc) == HEARTBEAT_FIELDS
    assert Heartbeat.model_validate(doc).worker == 3
    legacy = {k: v for k, v in doc.items() if k != "worker"}  # written by an agent from before the field
    assert Heartbeat.model_validate(legacy).worker == 0


def test_trainer_env_names_the_hosts_single_host_by_default(tmp_path):
    from respawn import contract
    from respawn.agent.agent import Agent
    from respawn.agent.config import AgentConfig, Hosts
    from respawn.agent.metadata import MetadataClient

    settings = parse_settings(json.dumps({**GOOD, "env": {contract.ENV_NODE_RANK: "7"}}))
    base = dict(job_id="j", attempt=2, project="p", node="j-2", zone=None, settings=settings, node_dir=str(tmp_path))
    md = MetadataClient("127.0.0.1:9")  # never asked: nothing is started
    single = Agent(AgentConfig(**base), md, writer=None).preparation.trainer_env()  # type: ignore[arg-type]
    # The agent's values win over the job's env; a single host is rank 0 of 1 with master 127.0.0.1.
    assert (single[contract.ENV_NODE_RANK], single[contract.ENV_NUM_NODES], single[contract.ENV_MASTER_ADDR]) == (
        "0", "1", "127.0.0.1")
    agent = Agent(AgentConfig(**base, hosts=Hosts(3, 4, "10.0.0.5")), md, writer=None)  # type: ignore[arg-type]
    env = agent.preparation.trainer_env()
    assert (env[contract.ENV_NODE_RANK], env[contract.ENV_NUM_NODES], env[contract.ENV_MASTER_ADDR]) == (
        "3", "4", "10.0.0.5")
    assert agent.heartbeater.node == "j-2-w3" and agent.snapshot()["worker"] == 3


def test_a_one_node_job_is_a_one_member_generation_and_a_member_follows_the_newest_that_names_it(tmp_path):
    """membership.join is the one place that tells the two apart: a one-node job's generation is due once, never
    renumbered, and any end of its trainer ends the node's life; a member's is due when the newest generation names
    it, and only exit 0 ends its life (any other waits for the next generation)."""
    from respawn import contract
    from respawn.agent.config import AgentConfig
    from respawn.agent.membership import Generations, OneMember, join
    from respawn.agent.metadata import MetadataClient

    md = MetadataClient("127.0.0.1:9")  # never asked: nothing is started
    base = dict(job_id="j", attempt=2, project="p", node="j-2", zone=None, settings=parse_settings(json.dumps(GOOD)),
                node_dir=str(tmp_path))
    one = join(AgentConfig(**base), md)
    assert isinstance(one, OneMember) and one.rank == 0
    generation = one.due()
    assert generation is not None and one.trainer_env(generation) == {} and one.joining(generation) == {}
    assert one.entered(generation) is False  # no number changed: no beat at once
    assert one.due() is None and not one.newer() and one.beat(True) == {"generation": None, "master_reachable": None}
    assert all(one.ends_life(code) for code in (0, 1, contract.EXIT_PREEMPTED, None))

    member = join(AgentConfig(**base, generation=""), md)
    assert isinstance(member, Generations) and member.rank is None and member.due() is None
    member.on_generation(contract.Generation(3, ("j-1", "j-2"), "10.0.0.1").to_json())
    first = member.due()
    assert first is not None and first.number == 3 and member.trainer_env(first)[contract.ENV_NODE_RANK] == "1"
    assert member.joining(first) == {"generation": 3, "members": ["j-1", "j-2"]} and member.rank == 1
    assert member.entered(first) is True and member.due() is None and not member.newer()
    member.on_generation(contract.Generation(2, ("j-2",), "10.0.0.2").to_json())  # older: ignored
    member.on_generation(contract.Generation(4, ("j-1", "j-3"), "10.0.0.1").to_json())  # leaves this node out
    assert member.newer() and member.due() is None
    assert member.ends_life(0) and not member.ends_life(1) and not member.ends_life(contract.EXIT_PREEMPTED)


def test_kill_reaches_a_worker_whose_launcher_exited_first(tmp_path):
    """A launcher that starts its worker in a session of its own and then exits leaves the worker reparented: out of
    the trainer's process group and no longer its descendant. kill() still finds it, by the run's marker."""
    import os
    import subprocess
    import sys
    import time

    from respawn.agent.supervisor import TrainerProcess

    pid_file = tmp_path / "worker.pid"
    launcher = ("import subprocess, sys; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
                f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(w.pid))")
    trainer = TrainerProcess.start(str(tmp_path), [sys.executable, "-c", launcher + "; import time; time.sleep(300)"],
                                   dict(os.environ), job_id="j", attempt=1, started_at=datetime.now(timezone.utc).isoformat())
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    # The launcher (the trainer's own command, in the group) goes first, as a killed or exiting torchrun does.
    subprocess.run(["pkill", "-KILL", "-P", str(trainer.pid)], check=False)
    time.sleep(0.3)
    assert os.path.exists(f"/proc/{worker}")
    trainer.kill()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{worker}") and "Z" not in open(f"/proc/{worker}/stat").read().rsplit(")", 1)[1][:3]:
        assert time.monotonic() < deadline, "the reparented worker outlived the kill"
        time.sleep(0.05)
