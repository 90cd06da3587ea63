"""Per-attempt logs (node_agent/logship.py): the real agent ships its setup's, its trainer's and its own output to
the job's checkpoint_uri in chunks as it runs (file:/// and the Cloud Storage emulator), a preempted node's logs are
read by `respawn jobs logs` after its replacement ran, and the final flush of a notice never delays the emergency
save or the final heartbeat, however slow the store."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from agent_fixtures import agent_env, attributes, gcs_standin, settings, wait_for  # noqa: F401
from respawn import contract, joblogs, schema
from respawn.contract import LogChunk
from sim_fixtures import sim_factory, sim_server  # noqa: F401 - fixtures
from trainer_helpers import BUCKET, gcs_emulator  # noqa: F401  (fixture)
from tests import respawn_forks



def chunks(store: Path) -> dict[tuple[int, str, str], bytes]:
    """(attempt, host, stream) → the stream's bytes as shipped, from a file:/// store's chunks in name order."""
    found: dict[tuple[int, str, str], bytes] = {}
    base = store / contract.LOGS_DIR
    for path in sorted(p for p in base.rglob("*.log")):
        chunk = contract.LogChunk.parse(str(path.relative_to(base)))
        assert chunk is not None, path
        key = (chunk.attempt, chunk.host, chunk.stream)
        assert len(found.get(key, b"")) == chunk.offset, f"{path}: a gap or an overlap before it"
        found[key] = found.get(key, b"") + path.read_bytes()
    return found


def test_layout_names_parse_back_and_sort_in_order():
    names = [contract.LogChunk(7, "job-7-w1", "trainer", o).name() for o in (0, 9, 10, 262144, 10**12)]
    assert names == sorted(names) and names[0] == "000007/job-7-w1/trainer/000000000000000.log"
    assert [contract.LogChunk.parse(n).offset for n in names] == [0, 9, 10, 262144, 10**12]
    assert contract.LogChunk.parse("000007/job-7/other/000000000000000.log") is None
    assert contract.LogChunk.parse("000007/job-7/trainer/12.log") is None
    assert contract.logs_uri("gs://b/runs/j/", 3) == "gs://b/runs/j/.respawn-logs/000003/"


def test_setup_trainer_and_agent_logs_reach_the_store_whole(agent_env):
    """Setup prints, the trainer prints more than a chunk holds: every stream arrives in order, without gaps or
    repeats, equal to the node's files; the trainer's last line (no newline) too, in the final flush."""
    store = agent_env.tmp / "store"
    loud = agent_env.tmp / "loud.py"
    loud.write_text("import sys, time\nfor i in range(6000):\n    print(f'trainer line {i:05d} ' + 'x' * 60)\n"
                    "time.sleep(1)\nsys.stdout.write('the end without a newline')\n")
    s = settings([sys.executable, str(loud)], f"file://{store}", interpreter=sys.executable,
                 setup=[[sys.executable, "-c", "print('setup says hello'); print('setup done')"]])
    md = agent_env.metadata("logjob-1", attributes("logjob", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "logjob-1")
    assert agent.wait(60) == 0, agent.output()[-3000:]
    shipped = chunks(store)
    node = agent_env.tmp / "logjob-1"
    assert shipped[(1, "logjob-1", "setup")] == b"setup says hello\nsetup done\n"
    trainer = shipped[(1, "logjob-1", "trainer")]
    assert trainer == (node / "trainer.log").read_bytes() and trainer.endswith(b"the end without a newline")
    assert len(trainer) > contract.LOG_CHUNK_BYTES  # so it went in several chunks
    assert len(list((store / contract.LOGS_DIR / "000001" / "logjob-1" / "trainer").iterdir())) >= 2
    agent_lines = [json.loads(line) for line in shipped[(1, "logjob-1", "agent")].splitlines()]
    assert agent_lines[0]["message"] == "node agent starting"
    assert all(e["logging.googleapis.com/labels"] == {"respawn_job": "logjob", "respawn_attempt": "1",
                                                      "respawn_node": "logjob-1", "respawn_rank": "0"}
               for e in agent_lines)  # Cloud Logging's labels on every line (docs/gcp-facts.md §22)
    assert "trainer finished successfully" in [e["message"] for e in agent_lines]


def test_every_shipped_line_is_a_labelled_cloud_logging_entry(agent_env, sim_server):
    """logs.cloud_logging: the setup's and the trainer's raw lines and the agent's JSON lines are written to Cloud
    Logging (entries.write, served by sim/) with the job, attempt, node and rank as labels, so one filter finds all
    of a job's lines; the agent's lines keep their severity; the VM is the monitored resource."""
    talk = agent_env.tmp / "talk.py"
    talk.write_text("print('step 1 loss 0.50')\nprint('step 2 loss 0.25')\n")
    s = settings([sys.executable, str(talk)], f"file://{agent_env.tmp / 'store'}", interpreter=sys.executable,
                 setup=[[sys.executable, "-c", "print('setup says hello')"]], cloud_logging=True)
    md = agent_env.metadata("cloudjob-1", attributes("cloudjob", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "cloudjob-1", RESPAWN_LOGGING_HOST=sim_server.endpoint)
    assert agent.wait(60) == 0, agent.output()[-3000:]
    labels = {"respawn_job": "cloudjob", "respawn_attempt": "1", "respawn_node": "cloudjob-1", "respawn_rank": "0"}
    by_log: dict[str, list[dict]] = {}
    for e in sim_server.cloud_logging.entries:
        by_log.setdefault(e["logName"].rsplit("/", 1)[1], []).append(e)
    assert [e["textPayload"] for e in by_log["respawn-trainer"]] == ["step 1 loss 0.50", "step 2 loss 0.25"]
    assert [e["textPayload"] for e in by_log["respawn-setup"]] == ["setup says hello"]
    agent_entries = by_log["respawn-agent"]
    assert agent_entries[0]["jsonPayload"]["message"] == "node agent starting"
    assert {e["severity"] for e in agent_entries} <= {"INFO", "WARNING", "ERROR"} and "INFO" in {
        e["severity"] for e in agent_entries}
    every = [e for entries in by_log.values() for e in entries]
    assert all(e["labels"] == labels for e in every), [e["labels"] for e in every if e["labels"] != labels][:3]
    assert all(e["resource"] == {"type": "gce_instance", "labels": {
        "project_id": agent_env.project, "zone": "us-central1-a", "instance_id": "1000000000000000001"}}
        for e in every)
    assert not [line for line in agent.output().splitlines() if "Cloud Logging" in line]  # no failure logged


def test_a_cloud_logging_that_cannot_be_reached_is_one_warning_and_the_bucket_still_gets_everything(agent_env):
    from sim.emulators import free_port

    s = settings([sys.executable, "-c", "print('a'); print('b')"], f"file://{agent_env.tmp / 'store'}",
                 interpreter=sys.executable, cloud_logging=True)
    md = agent_env.metadata("deaf-1", attributes("deaf", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "deaf-1", RESPAWN_LOGGING_HOST=f"http://127.0.0.1:{free_port()}")
    assert agent.wait(60) == 0, agent.output()[-3000:]
    warnings = [line for line in agent.output().splitlines()
                if "cannot write this node's lines to Cloud Logging" in line]
    assert len(warnings) == 1 and "logging.logEntries.create" in warnings[0]
    assert chunks(agent_env.tmp / "store")[(1, "deaf-1", "trainer")] == b"a\nb\n"


respawn_cli = respawn_forks.respawn  # the CLI's imports paid once, not once a command


def test_a_preempted_nodes_logs_are_read_after_its_replacement_ran(agent_env, gcs_emulator):
    """gs:// through the Cloud Storage emulator: attempt 1 is preempted mid-run, its node directory is gone (the VM
    with it), attempt 2 runs; `respawn jobs logs` shows what attempt 1 said up to its emergency save, each attempt,
    one node, the tail, the agents' lines on request, and clear errors for a bad attempt and a job without logs."""
    uri = f"gs://{BUCKET}/runs/logjob-{time.monotonic_ns()}"
    agent_env.db.collection(schema.JOBS).document("logjob").set({"spec": {"checkpoint_uri": uri}})
    talk = agent_env.tmp / "talk.py"
    talk.write_text(TALKING_TRAINER)
    s = settings([sys.executable, str(talk)], uri, interpreter=sys.executable,
                 setup=[[sys.executable, "-c", "print('setting up the environment')"]])
    md = agent_env.metadata("logjob-1", attributes("logjob", 1, agent_env.project, s))
    first = agent_env.agent(md, agent_env.tmp / "logjob-1", STORAGE_EMULATOR_HOST=gcs_emulator)
    wait_for(lambda: b"step 3 " in (agent_env.tmp / "logjob-1" / "trainer.log").read_bytes()
             if (agent_env.tmp / "logjob-1" / "trainer.log").exists() else False, 60, "attempt 1 training")
    md.set("instance/preempted", "TRUE")
    assert first.wait(30) == 0, first.output()[-3000:]
    shutil.rmtree(agent_env.tmp / "logjob-1")  # the preempted VM and its disk are gone
    s2 = {**s, "command": [sys.executable, str(talk), "--steps", "2"]}
    md2 = agent_env.metadata("logjob-2", attributes("logjob", 2, agent_env.project, s2))
    assert agent_env.agent(md2, agent_env.tmp / "logjob-2", STORAGE_EMULATOR_HOST=gcs_emulator).wait(60) == 0

    env = {"STORAGE_EMULATOR_HOST": gcs_emulator}
    r = respawn_cli("jobs", "logs", "logjob", "--attempt", "1", "--project", agent_env.project, env=env)
    assert r.returncode == 0, r.stderr
    said = r.stdout.splitlines()
    assert said[0] == "setting up the environment" and "talking trainer up, attempt 1" in said
    assert "emergency checkpoint saved; bye" == said[-1], said[-5:]  # said during the notice: the final flush
    assert not any(line.startswith("[") for line in said)  # one node: no prefix
    r = respawn_cli("jobs", "logs", "logjob", "--project", agent_env.project, env=env)
    every = r.stdout.splitlines()
    assert r.returncode == 0 and "[logjob-1] talking trainer up, attempt 1" in every, r.stdout
    assert every.index("[logjob-1] emergency checkpoint saved; bye") < every.index(
        "[logjob-2] talking trainer up, attempt 2") and every[-1] == "[logjob-2] done", every
    r = respawn_cli("jobs", "logs", "logjob", "--node", "logjob-2", "--tail", "2", "--project", agent_env.project,
                    env=env)
    assert r.stdout.splitlines() == ["step 2 of 2", "done"], r.stdout
    r = respawn_cli("jobs", "logs", "logjob", "--attempt", "1", "--agent", "--project", agent_env.project, env=env)
    assert '"message": "notice handled; agent exiting"' in r.stdout
    r = respawn_cli("jobs", "logs", "logjob", "--attempt", "7", "--project", agent_env.project, env=env)
    assert r.returncode == 1 and "attempt 7 of job 'logjob' has no logs; attempts with logs: 1, 2" in r.stderr
    agent_env.db.collection(schema.JOBS).document("quiet").set({"spec": {"checkpoint_uri": uri + "-quiet"}})
    r = respawn_cli("jobs", "logs", "quiet", "--project", agent_env.project, env=env)
    assert r.returncode == 1 and "job 'quiet' has no logs under " in r.stderr, r.stderr


# Prints a line per step, stops at the notice with an "emergency save" (a committed step in its status file, stamped
# with the time it was committed: the save's commit time) and a last line said during the notice.
TALKING_TRAINER = r'''
import argparse, json, os, signal, sys, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100000)
a = p.parse_args()
status = os.environ["RESPAWN_STATUS_FILE"]
notice = []
signal.signal(signal.SIGTERM, lambda *_: notice.append(time.time()))
print("talking trainer up, attempt", os.environ["RESPAWN_ATTEMPT"], flush=True)
for step in range(1, a.steps + 1):
    time.sleep(0.05)
    if notice:
        with open(status + ".tmp", "w") as f:
            json.dump({"step": step, "committed_step": step, "committed_kind": "emergency", "committed_at": time.time(),
                       "emergency": {"state": "committed", "step": step, "reason": None}}, f)
        os.replace(status + ".tmp", status)
        print("emergency checkpoint saved; bye", flush=True)
        sys.exit(75)
    print(f"step {step} of {a.steps}", flush=True)
print("done", flush=True)
'''


@pytest.fixture
def slow_log_store(tmp_path):
    """tests/gcs_standin.py accepting every upload, each one-request upload (a log chunk) answered after 4 s."""
    with gcs_standin(tmp_path, "--get", "404", "--upload", "200", "--media-seconds", "4") as standin:
        yield standin


def sending_to_the_slow_store(agent_env, slow_log_store, job: str):
    """An agent (job `job`, attempt 1) whose talking trainer's logs go to the slow store, once its first log chunk
    is on its way there: (the agent, its metadata, its node folder)."""
    host, requests = slow_log_store
    talk = agent_env.tmp / "talk.py"
    talk.write_text(TALKING_TRAINER)
    s = settings([sys.executable, str(talk)], f"gs://b/runs/{job}", interpreter=sys.executable)
    md = agent_env.metadata(f"{job}-1", attributes(job, 1, agent_env.project, s))
    node = agent_env.tmp / f"{job}-1"
    agent = agent_env.agent(md, node, STORAGE_EMULATOR_HOST=host)
    wait_for(lambda: "uploadType=media" in requests.read_text() if requests.exists() else False, 60,
             "a log chunk on its way to the slow store")
    return agent, md, node


@pytest.fixture
def stalled_log_store(tmp_path):
    """tests/gcs_standin.py accepting every upload, but answering no one-request upload (a log chunk) while the test
    runs: a send begun never ends."""
    with gcs_standin(tmp_path, "--get", "404", "--upload", "200", "--media-seconds", "3600") as standin:
        yield standin


def test_the_final_flush_never_delays_the_emergency_save_or_the_final_heartbeat(agent_env, stalled_log_store):
    """A log send in flight at the notice never ends: the emergency save still commits, the final heartbeat lands
    (exited, preempted) and the final flush gives up at its bound, so the agent exits. Had any of them waited for
    the logs, none would have happened (no duration is asserted: what waits on the send never gets past it)."""
    agent, md, node = sending_to_the_slow_store(agent_env, stalled_log_store, "slowlogs")
    md.set("instance/preempted", "TRUE")
    assert agent.wait(30) == 0, agent.output()[-3000:]
    status = json.loads((node / contract.STATUS_FILE).read_text())
    assert status["emergency"]["state"] == "committed" and status["committed_kind"] == "emergency", status
    hb = agent_env.heartbeat("slowlogs-1")
    assert hb["state"] == "exited" and hb["exit_code"] == contract.EXIT_PREEMPTED
    assert hb["committed_step"] == status["committed_step"], hb
    flush = [e for e in agent.events() if e["message"].startswith("final log flush")]
    assert flush and flush[0]["severity"] == "WARNING", agent.messages()[-10:]


def test_follow_lists_again_only_new_attempts_and_those_still_writing():
    written = {1: 1000.0, 2: 1590.0, 3: 1999.0}
    assert joblogs.follow_attempts([1, 2, 3, 4], written, now=2000.0) == [2, 3, 4]
    assert joblogs.follow_attempts([1, 2, 3, 4], written, now=2200.0) == [3, 4]


def test_merge_keeps_each_sequence_in_order_and_interleaves_by_time():
    def item(host, stream, offset, at, size=3):
        return joblogs.Listed(contract.LogChunk(4, host, stream, offset).name(), size, at)

    listed = [item("j-4", "trainer", 3, 10.0), item("j-4", "trainer", 0, 12.0),  # re-sent later: still first
              item("j-4-w1", "trainer", 0, 11.0), item("j-4", "agent", 0, 1.0), item("j-4", "setup", 0, 5.0)]
    shown = joblogs.select(listed, job_id="j", where="x")
    assert [(s.chunk.host, s.chunk.stream, s.chunk.offset) for s in shown] == [
        ("j-4", "setup", 0), ("j-4-w1", "trainer", 0), ("j-4", "trainer", 0), ("j-4", "trainer", 3)]
    data = {s.listed.name: f"{s.chunk.host}:{s.chunk.offset}\n".encode() for s in shown}
    assert list(joblogs.lines(shown, lambda s: data[s.listed.name])) == [
        "[j-4 w0] j-4:0", "[j-4 w1] j-4-w1:0", "[j-4 w0] j-4:0", "[j-4 w0] j-4:3"]
    assert list(joblogs.lines(shown[2:], lambda s: data[s.listed.name])) == ["j-4:0", "j-4:3"]  # one host


def test_follow_prints_new_chunks_as_they_come(agent_env):
    """--follow on a file:/// store: what is there, then each new chunk, and a chunk re-sent longer (a restarted
    agent) only for what it adds; two hosts: each line prefixed."""
    store = agent_env.tmp / "ckpt"
    agent_env.db.collection(schema.JOBS).document("f").set({"spec": {"checkpoint_uri": store.as_uri()}})
    base = store / contract.LOGS_DIR

    def put(host: str, offset: int, data: bytes) -> None:
        path = base / contract.LogChunk(1, host, "trainer", offset).name()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    put("f-1", 0, b"one\n")
    proc = subprocess.Popen([sys.executable, "-m", "respawn", "jobs", "logs", "f", "--follow", "--project",
                             agent_env.project], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: lines == ["one\n"], 30, "the first chunk")
        put("f-1", 0, b"one\ntwo\n")  # re-sent, longer
        wait_for(lambda: lines[1:] == ["two\n"], 15, "what the re-sent chunk adds")
        put("f-1", 8, b"three\n")
        put("f-1-w1", 0, b"from worker 1\n")
        wait_for(lambda: len(lines) == 4, 15, "the next chunks")
        assert sorted(lines[2:]) == ["[f-1 w0] three\n", "[f-1 w1] from worker 1\n"], lines
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_restarted_agent_goes_on_where_the_last_one_stopped(agent_env):
    """SIGHUP (an agent upgrade): the next agent adopts the trainer and ships from logship.json's offsets; after the
    preemption the stream in the store is the node's trainer.log exactly: nothing lost, nothing twice."""
    store = agent_env.tmp / "store"
    talk = agent_env.tmp / "talk.py"
    talk.write_text(TALKING_TRAINER)
    s = settings([sys.executable, str(talk)], store.as_uri(), interpreter=sys.executable)
    md = agent_env.metadata("hup-1", attributes("hup", 1, agent_env.project, s))
    node = agent_env.tmp / "hup-1"
    first = agent_env.agent(md, node)
    shipped = store / contract.LOGS_DIR / "000001" / "hup-1" / "trainer"
    wait_for(lambda: shipped.exists() and list(shipped.iterdir()), 30, "the first trainer chunk")
    first.proc.send_signal(signal.SIGHUP)
    assert first.wait(30) == contract.EXIT_AGENT_DETACH
    sent = json.loads((node / "logship.json").read_text())["offsets"]["trainer"]
    assert sent > 0
    second = agent_env.agent(md, node)
    # It goes on from the recorded offset (the first agent may have shipped two chunks itself: wait for that one).
    wait_for(lambda: (shipped / f"{sent:015d}.log").exists(), 30, f"the second agent's chunk at offset {sent}")
    md.set("instance/preempted", "TRUE")
    assert second.wait(30) == 0
    assert chunks(store)[(1, "hup-1", "trainer")] == (node / "trainer.log").read_bytes()


def test_sighup_during_a_log_send_records_it_before_the_agent_exits(agent_env, slow_log_store):
    """SIGHUP while a chunk is on its way (every send takes 4 s): the agent lets the send finish and records it in
    logship.json before it exits, so the next agent goes on after it rather than sending it again. (It once exited
    at once, and a restarted agent found no record at all.)"""
    host, requests = slow_log_store
    first, md, node = sending_to_the_slow_store(agent_env, slow_log_store, "hupslow")
    first.proc.send_signal(signal.SIGHUP)
    assert first.wait(30) == contract.EXIT_AGENT_DETACH, first.output()[-3000:]
    # Every chunk whose send had begun (the store's request log names each by stream and offset) is recorded as sent.
    names = [parse_qs(urlsplit(line.split()[1]).query)["name"][0] for line in requests.read_text().splitlines()
             if "uploadType=media" in line]
    begun = [LogChunk.parse(name.split(f"/{contract.LOGS_DIR}/", 1)[1]) for name in names]
    record = json.loads((node / "logship.json").read_text())["offsets"]
    assert begun and all(record[c.stream] > c.offset for c in begun), (begun, record)
    # The next agent adopts the trainer and goes on; preempted, it stops it.
    second = agent_env.agent(md, node, STORAGE_EMULATOR_HOST=host)
    wait_for(lambda: any(e["message"].startswith("adopting the trainer") for e in second.events()), 30,
             "the trainer adopted")
    md.set("instance/preempted", "TRUE")
    assert second.wait(30) == 0, second.output()[-3000:]


def test_a_store_that_refuses_is_one_warning_naming_the_permission(agent_env, tmp_path):
    """Cloud Storage answers 403 to every send: one WARNING per streak naming the object and the permission, the
    trainer runs and its end is reported as usual, and the agent does not linger over the logs."""
    with gcs_standin(tmp_path, "--get", "404", "--upload", "403") as (host, _):
        s = settings([sys.executable, str(agent_env.tiny_trainer), "--steps", "150"], "gs://b/runs/refused")
        md = agent_env.metadata("refused-1", attributes("refused", 1, agent_env.project, s))
        agent = agent_env.agent(md, agent_env.tmp / "refused-1", STORAGE_EMULATOR_HOST=host)
        assert agent.wait(60) == 0
    warned = [e for e in agent.events() if e["message"].startswith("cannot ship logs")]
    assert len(warned) == 1, [e["message"] for e in agent.events()]
    assert "storage.objects.create" in warned[0]["error"] and "gs://b/runs/refused/.respawn-logs/000001/" in \
        warned[0]["uri"]
    assert agent_env.heartbeat("refused-1")["exit_code"] == 0
