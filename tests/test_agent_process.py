"""The node agent's own mechanics, with real processes: the agent (`python -m respawn.agent`), the sim metadata
server, the Firestore emulator and a tiny trainer that follows the trainer library's contract.

Tests that take `node_python` run once per node image Python (3.9, 3.10 and the current one): the notice path,
the trainer's own exit, adoption and the deadline's process-group kill, with the older interpreters bare (only
the installed respawn/ tree, no third-party packages). The workdir test runs the agent on the bare 3.9 with the
user's code in the Cloud Storage emulator, a setup command, and the trainer on another interpreter, over a
restart in place."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import tarfile
from datetime import datetime

import pytest

from agent_fixtures import (TINY_TRAINER, NodePython, agent_env, agent_tree, attributes, node_image_python,  # noqa: F401
                            node_python, settings, wait_for)
from respawn.contract import EXIT_PREEMPTED
from respawn.schema import Heartbeat
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401  (fixtures)


def _tiny(env, *flags: str) -> list[str]:
    return [sys.executable, str(env.tiny_trainer), *flags]


def _setup(env, node: str, command: list[str], **extra):
    job, attempt = node.rsplit("-", 1)
    s = settings(command, f"file://{env.tmp}/store", **extra)
    md = env.metadata(node, attributes(job, int(attempt), env.project, s))
    return md, env.tmp / node


def test_already_preempted_at_boot_is_a_notice_and_no_trainer_starts(agent_env, node_python):
    # A node flagged before the agent looked must not wait for a change that never comes.
    md, node_dir = _setup(agent_env, "boot-1", _tiny(agent_env))
    md.set("instance/preempted", "TRUE")
    agent = agent_env.agent(md, node_dir, python=node_python)
    assert agent.wait(60) == 0
    hb = agent_env.heartbeat("boot-1")
    assert hb["state"] == "exited" and hb["notice"] == "preempted"
    assert not agent.has("trainer started")


def test_agent_restart_adopts_the_running_trainer_instead_of_starting_a_second(agent_env, node_python):
    md, node_dir = _setup(agent_env, "adopt-1", _tiny(agent_env))
    first = agent_env.agent(md, node_dir, python=node_python)
    wait_for(lambda: (agent_env.heartbeat("adopt-1") or {}).get("step"), 60, "the first agent's heartbeat with a step")
    pid = first.trainer_record()["pid"]
    os.killpg(first.proc.pid, signal.SIGKILL)  # the agent dies hard; the trainer is in its own group
    first.proc.wait(10)
    os.kill(pid, 0)  # still running

    second = agent_env.agent(md, node_dir, python=node_python)
    wait_for(lambda: second.has("adopting the trainer a previous agent started"), 60, "adoption")
    assert not second.has("trainer started")
    assert second.trainer_record()["pid"] == pid
    md.set("instance/preempted", "TRUE")
    assert second.wait(60) == 0
    hb = agent_env.heartbeat("adopt-1")
    # An adopted trainer is not the agent's child; its exit status comes from the wrapper's exit file.
    assert hb["state"] == "exited" and hb["exit_code"] == EXIT_PREEMPTED
    assert hb["emergency"]["state"] == "committed" and hb["committed_step"] == hb["emergency"]["step"]


def test_trainer_that_ended_while_no_agent_watched_is_reported_not_restarted(agent_env):
    md, node_dir = _setup(agent_env, "gap-1", _tiny(agent_env, "--steps", "40"))
    first = agent_env.agent(md, node_dir)
    wait_for(lambda: first.trainer_record(), 60, "the trainer record")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    wait_for(lambda: (node_dir / "trainer.exit").exists(), 60, "the trainer to finish on its own")

    second = agent_env.agent(md, node_dir)
    assert second.wait(60) == 0
    assert second.has("the trainer ended while no agent was watching; reporting it, starting nothing")
    assert not second.has("trainer started")
    hb = agent_env.heartbeat("gap-1")
    assert hb["state"] == "exited" and hb["exit_code"] == 0


def test_notice_is_handled_while_firestore_is_unreachable(agent_env):
    # Heartbeats fail (nothing listens there); the notice must still reach the trainer and be waited for.
    from sim.emulators import free_port

    md, node_dir = _setup(agent_env, "nofs-1", _tiny(agent_env), notice_budget_seconds=10)
    agent = agent_env.agent(md, node_dir, FIRESTORE_EMULATOR_HOST=f"127.0.0.1:{free_port()}")
    wait_for(lambda: agent.has("heartbeat write failed; backing off"), 60, "a failed heartbeat")
    wait_for(lambda: (node_dir / "status.json").exists(), 60, "the trainer's first step")
    md.set("instance/preempted", "TRUE")
    assert agent.wait(60) == 0
    status = json.loads((node_dir / "status.json").read_text())
    assert status["emergency"]["state"] == "committed"
    done = [e for e in agent.events() if e["message"] == "notice handled; agent exiting"][0]
    assert done["exit_code"] == 75 and done["final_heartbeat_written"] is False


def test_trainer_that_ignores_the_notice_is_killed_at_the_deadline(agent_env, node_python):
    md, node_dir = _setup(agent_env, "stuck-1", _tiny(agent_env, "--ignore-notice"), notice_budget_seconds=2)
    agent = agent_env.agent(md, node_dir, python=node_python)
    # A step, not just `training`: the trainer has its SIGTERM handler by then (before it, the notice kills it).
    wait_for(lambda: (agent_env.heartbeat("stuck-1") or {}).get("step"), 60, "training with a step")
    md.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    assert agent.wait(60) == 0
    assert agent.has("the trainer did not exit within the notice budget; killing its process group")
    hb = agent_env.heartbeat("stuck-1")
    assert hb["state"] == "exited" and hb["notice"] == "maintenance-event"
    assert hb["exit_code"] == 137  # the wrapper was SIGKILLed with the group: 128 + 9


def test_migrate_maintenance_is_not_a_notice(agent_env):
    md, node_dir = _setup(agent_env, "migr-1", _tiny(agent_env, "--steps", "150"))
    agent = agent_env.agent(md, node_dir)
    wait_for(lambda: agent.has("trainer started"), 60, "the trainer")
    md.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    assert agent.wait(60) == 0
    hb = agent_env.heartbeat("migr-1")
    assert hb["notice"] is None and hb["exit_code"] == 0


def test_missing_attribute_is_named_and_exits_non_zero(agent_env):
    s = settings(_tiny(agent_env), f"file://{agent_env.tmp}/store")
    attrs = attributes("cfg", 1, agent_env.project, s)
    del attrs["respawn-project"]
    md = agent_env.metadata("cfg-1", attrs)
    agent = agent_env.agent(md, agent_env.tmp / "cfg-1")
    assert agent.wait(60) == 2
    errors = [e for e in agent.events() if e["severity"] == "ERROR"]
    assert errors and errors[0]["attribute"] == "respawn-project" and "respawn-project" in errors[0]["message"]


def test_invalid_settings_are_named(agent_env):
    attrs = attributes("bad", 1, agent_env.project, {"command": "python train.py", "checkpoint_uri": "file:///x"})
    md = agent_env.metadata("bad-1", attrs)
    agent = agent_env.agent(md, agent_env.tmp / "bad-1")
    assert agent.wait(60) == 2
    error = [e for e in agent.events() if e["severity"] == "ERROR"][0]
    assert error["attribute"] == "respawn-settings" and "argv list" in error["message"]


def test_a_tpu_worker_heartbeats_under_the_tpu_node_name(agent_env, node_python):
    # On a TPU VM instance/name is the worker VM (t1v-n-…-w-0); the controller knows the node as {job}-{attempt}.
    # The trainer exits on its own: the final heartbeat, as the control plane reads it, on each node Python.
    s = settings(_tiny(agent_env, "--steps", "20"), f"file://{agent_env.tmp}/store")
    md = agent_env.metadata("t1v-n-4f2a9c1e-w-0", attributes("tpujob", 3, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "tpujob-3", python=node_python)
    assert agent.wait(60) == 0
    hb = agent_env.heartbeat("tpujob-3")
    assert hb["job_id"] == "tpujob" and hb["attempt"] == 3 and hb["exit_code"] == 0
    assert hb["state"] == "exited" and hb["zone"] == "us-central1-a" and hb["notice"] is None
    assert hb["step"] == hb["total_steps"] == 20 and hb["output_tail"] is None
    assert isinstance(hb["started_at"], datetime) and isinstance(hb["heartbeat_at"], datetime)
    assert hb["started_at"] <= hb["heartbeat_at"]
    Heartbeat.model_validate(hb)  # what the control plane reads heartbeats with
    started = [e for e in agent.events() if e["message"] == "node agent starting"][0]
    expected = node_python.label if node_python.label != "current" else "%d.%d" % sys.version_info[:2]
    assert started["python"].startswith(expected + "."), started["python"]
    assert agent_env.heartbeat("t1v-n-4f2a9c1e-w-0") is None


# The workdir's trainer: the tiny trainer, saying which interpreter runs it and where.
WORKDIR_TRAINER = 'import os, sys\nprint("trainer on", sys.executable, "in", os.getcwd(), flush=True)\n'
SETUP_SCRIPT = 'import os, sys\nwith open("setup.out", "a") as f:\n    f.write(sys.executable + " " + os.environ["PATH"].split(os.pathsep)[0] + "\\n")\nprint("setup done", flush=True)\n'


def test_workdir_setup_and_interpreter_on_the_bare_node_python(agent_env, agent_tree, gcs):
    # The agent on a bare 3.9 (Debian 11's python3); the user's code from Cloud Storage; setup and the trainer run
    # by the chosen interpreter (this checkout's venv standing in for /opt/conda/bin/python).
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("train.py", WORKDIR_TRAINER + TINY_TRAINER), ("tools/setup_env.py", SETUP_SCRIPT)):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    blob = gcs.bucket(BUCKET).blob(f"workdirs/wd-1/sha256-{digest}.tar.gz")
    blob.upload_from_string(data)
    interpreter = sys.executable
    md, node_dir = _setup(agent_env, "wd-1", ["python", "train.py"], interpreter=interpreter,
                          workdir=f"gs://{BUCKET}/{blob.name}", setup=[["python3", "tools/setup_env.py"]])
    py39 = NodePython("3.9", node_image_python("3.9"), str(agent_tree))
    workdir = node_dir / "workdirs" / f"sha256-{digest}"

    def life(boot: str):
        agent = agent_env.agent(md, node_dir, python=py39, RESPAWN_BOOT_ID=boot)
        hb = wait_for(lambda: (h := agent_env.heartbeat("wd-1") or {}).get("state") == "training" and h.get("step")
                      and h, 60, f"{boot}: training with a step")
        assert hb["failed_command"] is None and hb["exit_code"] is None
        wait_for(lambda: f"trainer on {interpreter} in {workdir}" in agent.output(), 30, "the trainer's first line")
        md.set("instance/preempted", "TRUE")
        assert agent.wait(60) == 0
        md.set("instance/preempted", "FALSE")
        return agent, [e for e in agent.events() if e["message"] == "prepare stage"]

    first, stages = life("boot-a")
    assert [s["stage"] for s in stages] == ["workdir_download", "workdir_unpack", "setup_command", "setup"]
    assert all(isinstance(s["seconds"], float) for s in stages) and stages[0]["bytes"] == len(data)
    assert (workdir / "setup.out").read_text() == f"{interpreter} {os.path.dirname(interpreter)}\n"
    assert any(e["message"] == "setup output" and e["line"] == "setup done" for e in first.events())
    # Restart in place (a new boot, the same disk): the archive is gone from the bucket, yet nothing is fetched
    # and setup, whose inputs did not change, does not run again.
    # The previous-life upload of the first life's emergency checkpoint runs with the trainer's interpreter, where
    # the checkpoint library is (on the bare 3.9 `-m respawn.ckpt` fails: no NumPy), before setup's turn.
    blob.delete()
    second, stages = life("boot-b")
    assert [s["stage"] for s in stages] == ["workdir_reuse", "previous_life_upload", "setup"]
    assert stages[2]["skipped"] is True
    upload = [e for e in second.events() if e["message"].startswith("uploading checkpoints left on this disk")][0]
    assert upload["interpreter"] == interpreter
    assert (workdir / "setup.out").read_text().count("\n") == 1
    started = [e for e in second.events() if e["message"] == "trainer started"][0]
    assert started["argv"] == [interpreter, "train.py"] and started["cwd"] == str(workdir)


# The trainer of a slice's worker: records what the agent told it about the hosts, then is the tiny trainer.
HOSTS_TRAINER = ("import json, os, runpy, sys\n"
                 "keys = ('RESPAWN_NODE_RANK', 'RESPAWN_NUM_NODES', 'RESPAWN_MASTER_ADDR')\n"
                 "open('hosts.json', 'w').write(json.dumps({k: os.environ.get(k) for k in keys}))\n"
                 "sys.argv = [sys.argv[1]] + sys.argv[2:]\n"
                 "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.mark.parametrize("endpoints, master", [
    ("t1v-n-0badc0de-w-0,t1v-n-0badc0de-w-1", "t1v-n-0badc0de-w-0"),  # hostnames
    ("t1v-n-0badc0de-w-0:5523180148856364731:10.130.0.7,t1v-n-0badc0de-w-1:1170094466028617346:10.130.0.8",
     "10.130.0.7"),  # name:uid:IP triples
], ids=["hostnames", "triples"])
def test_workers_of_a_slice_beat_to_their_own_documents_and_each_takes_the_notice(agent_env, node_python, endpoints,
                                                                                  master):
    # Two worker VMs of one multi-host TPU node (slice-4): each has its own metadata server with Cloud TPU's worker
    # attributes (in either format), its own disk and agent. Worker 0 beats to nodes/slice-4 (where the control plane
    # reads the node), worker 1 to nodes/slice-4-w1; each trainer learns its rank, the slice's size and worker 0's
    # address as the metadata gives it.
    s = settings([sys.executable, "-c", HOSTS_TRAINER, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store")
    agents, servers, dirs = [], [], []
    for w in range(2):
        attrs = {**attributes("slice", 4, agent_env.project, s), "agent-worker-number": str(w),
                 "worker-network-endpoints": endpoints, "accelerator-type": "v4-16"}
        servers.append(agent_env.metadata(f"t1v-n-0badc0de-w-{w}", attrs))
        dirs.append(agent_env.tmp / f"slice-4.w{w}")
        agents.append(agent_env.agent(servers[w], dirs[w], python=node_python))
    docs = ["slice-4", "slice-4-w1"]
    for w, doc in enumerate(docs):
        hb = wait_for(lambda: (h := agent_env.heartbeat(doc) or {}).get("step") and h, 60, f"worker {w} training")
        assert hb["worker"] == w and hb["job_id"] == "slice" and hb["attempt"] == 4
        Heartbeat.model_validate(hb)
        assert json.loads((dirs[w] / "hosts.json").read_text()) == {
            "RESPAWN_NODE_RANK": str(w), "RESPAWN_NUM_NODES": "2", "RESPAWN_MASTER_ADDR": master}
        [seen] = [e for e in agents[w].events() if e["message"] == "TPU worker metadata"]  # what was served, as is
        assert (seen["worker"], seen["workers"], seen["worker_network_endpoints"]) == (w, 2, endpoints)
    for md in servers:  # the slice is preempted as a whole: every worker's metadata server says so
        md.set("instance/preempted", "TRUE")
    for w, (agent, doc) in enumerate(zip(agents, docs)):
        assert agent.wait(60) == 0, f"worker {w}"
        hb = agent_env.heartbeat(doc)
        assert hb["worker"] == w and hb["state"] == "exited" and hb["notice"] == "preempted"
        assert hb["exit_code"] == EXIT_PREEMPTED and hb["emergency"]["state"] == "committed"
    assert agent_env.heartbeat("slice-4-w0") is None  # worker 0 has no document of its own


def test_a_single_host_tpu_vm_gives_its_trainer_the_loopback_as_master(agent_env):
    # One host (v5litepod-8, the tpu-queued demo scenario's node; moved down from tests/test_demo_scenarios.py): the
    # agent reads Cloud TPU's worker attributes as a slice's workers do, and a single host's master is its loopback.
    s = settings([sys.executable, "-c", HOSTS_TRAINER, str(agent_env.tiny_trainer), "--steps", "20"],
                 f"file://{agent_env.tmp}/store")
    attrs = {**attributes("single", 2, agent_env.project, s), "agent-worker-number": "0",
             "worker-network-endpoints": "t1v-n-0badc0de-w-0", "accelerator-type": "v5litepod-8"}
    node_dir = agent_env.tmp / "single-2"
    agent = agent_env.agent(agent_env.metadata("t1v-n-0badc0de-w-0", attrs), node_dir)
    assert agent.wait(60) == 0
    [seen] = [e for e in agent.events() if e["message"] == "TPU worker metadata"]
    assert (seen["worker"], seen["workers"], seen["master_addr"]) == (0, 1, "127.0.0.1"), seen
    hosts = json.loads((node_dir / "hosts.json").read_text())
    assert hosts == {"RESPAWN_NODE_RANK": "0", "RESPAWN_NUM_NODES": "1", "RESPAWN_MASTER_ADDR": "127.0.0.1"}
    hb = agent_env.heartbeat("single-2")
    assert (hb["state"], hb["exit_code"], hb["worker"]) == ("exited", 0, 0)


def test_a_malformed_worker_attribute_is_named_and_exits_non_zero(agent_env):
    s = settings(_tiny(agent_env), f"file://{agent_env.tmp}/store")
    attrs = {**attributes("badw", 1, agent_env.project, s), "agent-worker-number": "1",
             "worker-network-endpoints": "t1v-n-1-w-0,t1v-n-1-w-1:8470"}
    agent = agent_env.agent(agent_env.metadata("t1v-n-1-w-1", attrs), agent_env.tmp / "badw-1")
    assert agent.wait(60) == 2
    error = [e for e in agent.events() if e["severity"] == "ERROR"][0]
    assert error["attribute"] == "worker-network-endpoints" and "entry 1 ('t1v-n-1-w-1:8470')" in error["message"]
    assert "'t1v-n-1-w-0,t1v-n-1-w-1:8470'" in error["message"]
    assert agent_env.heartbeat("badw-1") is None and agent_env.heartbeat("badw-1-w1") is None


GENERATION_TRAINER = (
    "import json, os, runpy, sys\n"
    "keys = ('RESPAWN_NODE_RANK', 'RESPAWN_NUM_NODES', 'RESPAWN_MASTER_ADDR', 'RESPAWN_GENERATION', 'PET_NNODES',\n"
    "        'PET_NODE_RANK', 'PET_MASTER_ADDR', 'PET_MASTER_PORT')\n"
    "open('gen-%s.json' % os.environ['RESPAWN_GENERATION'], 'w').write(json.dumps({k: os.environ.get(k) for k in keys}))\n"
    "sys.argv = [sys.argv[1]] + sys.argv[2:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def test_a_multi_node_member_trains_in_each_generation_that_names_it(agent_env, node_python):
    # A member VM of a multi-node GPU job (respawn-generation set, empty at boot): it prepares and waits; each
    # generation that names it starts its trainer with that generation's ranks (RESPAWN_* and torchrun's PET_*);
    # a newer one stops the trainer (its emergency save, exit 75) and starts it again with the new ranks; one that
    # leaves it out stops it and starts nothing. A malformed value is named and ignored.
    from respawn.contract import Generation

    s = settings([sys.executable, "-c", GENERATION_TRAINER, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store")
    md = agent_env.metadata("mn-2", {**attributes("mn", 2, agent_env.project, s), "respawn-generation": ""})
    node_dir = agent_env.tmp / "mn-2"
    agent = agent_env.agent(md, node_dir, python=node_python)

    def beat(**want):
        return wait_for(lambda: (h := agent_env.heartbeat("mn-2") or {}) and all(h.get(k) == v for k, v in want.items())
                        and h, 60, f"a heartbeat with {want}")

    beat(state="waiting", generation=None)
    md.set_attribute("respawn-generation", "{not json")
    wait_for(lambda: agent.has("ignoring a malformed generation; the control plane writes the next one"), 30,
             "the malformed generation named")
    assert not list(node_dir.glob("gen-*.json")) and not agent.has("trainer started")

    md.set_attribute("respawn-generation", Generation(1, ("mn-1", "mn-2"), "10.0.0.5").to_json())
    beat(state="training", generation=1)
    assert json.loads(wait_for(lambda: (node_dir / "gen-1.json").exists() and (node_dir / "gen-1.json").read_text(),
                               30, "generation 1's trainer")) == {
        "RESPAWN_NODE_RANK": "1", "RESPAWN_NUM_NODES": "2", "RESPAWN_MASTER_ADDR": "10.0.0.5", "RESPAWN_GENERATION": "1",
        "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "10.0.0.5", "PET_MASTER_PORT": "29501"}

    wait_for(lambda: (agent_env.heartbeat("mn-2") or {}).get("step"), 30, "generation 1's trainer stepping")
    md.set_attribute("respawn-generation", Generation(2, ("mn-2", "mn-3"), "10.0.0.9").to_json())  # mn-1 lost
    beat(state="training", generation=2)
    gen2 = json.loads(wait_for(lambda: (node_dir / "gen-2.json").exists() and (node_dir / "gen-2.json").read_text(),
                               30, "generation 2's trainer"))
    # A port of its own (contract.generation_port): generation 1's store, still up while its master stops, is not it.
    assert (gen2["RESPAWN_NODE_RANK"], gen2["PET_MASTER_ADDR"], gen2["PET_NNODES"], gen2["PET_MASTER_PORT"]) == (
        "0", "10.0.0.9", "2", "29502")
    assert agent.has("new generation: stopping the trainer to restart it with the new membership")
    assert "emergency checkpoint committed at step" in (node_dir / "trainer.log").read_text()  # stopped, not killed

    wait_for(lambda: (agent_env.heartbeat("mn-2") or {}).get("step"), 30, "generation 2's trainer stepping")
    md.set_attribute("respawn-generation", Generation(3, ("mn-1", "mn-3"), "10.0.0.5").to_json())  # left out
    hb = beat(state="waiting", generation=2)
    assert hb["exit_code"] == EXIT_PREEMPTED
    assert not (node_dir / "gen-3.json").exists()

    md.set("instance/preempted", "TRUE")
    assert agent.wait(60) == 0
    hb = agent_env.heartbeat("mn-2")
    assert hb["state"] == "exited" and hb["notice"] == "preempted"
    Heartbeat.model_validate(hb)
