"""Helpers for the node agent tests: a per-test metadata server (sim.metadata), the agent as a real process
(`python -m respawn.agent`, as the sim and systemd run it), and a tiny trainer that follows the trainer library's
contract (status file, SIGTERM → emergency checkpoint → exit 75) for the agent's own mechanics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from respawn.agent.supervisor import TrainerRecord
from sim.metadata import MetadataServer

REPO = Path(__file__).resolve().parent.parent

# Follows the status file and exit code of respawn.contract (TrainerStatus, EXIT_PREEMPTED). Flags: --steps N, --step-seconds S,
# --crash-at K (print a few lines, exit 3), --ignore-notice (never exits on SIGTERM: the deadline test).
TINY_TRAINER = r'''
import argparse, json, os, signal, sys, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--step-seconds", type=float, default=0.02)
p.add_argument("--crash-at", type=int, default=0)
p.add_argument("--ignore-notice", action="store_true")
a = p.parse_args()
status, local = os.environ["RESPAWN_STATUS_FILE"], os.environ["RESPAWN_LOCAL_CHECKPOINT_DIR"]
notice = []
signal.signal(signal.SIGTERM, lambda *_: notice.append(time.time()))
def write(**d):
    d.update(total_steps=a.steps, updated_at=time.time(), pid=os.getpid())
    d.setdefault("emergency", {"state": "idle", "step": None, "reason": None})
    with open(status + ".tmp", "w") as f:
        json.dump(d, f)
    os.replace(status + ".tmp", status)
print("tiny trainer up", os.environ["RESPAWN_JOB_ID"], os.environ["RESPAWN_ATTEMPT"], flush=True)
for step in range(1, a.steps + 1):
    time.sleep(a.step_seconds)
    if a.crash_at and step == a.crash_at:
        for i in range(60):
            print(f"noise line {i}", flush=True)
        print("Traceback (most recent call last):\nRuntimeError: loss is NaN at step %d" % step, flush=True)
        sys.exit(3)
    if notice and not a.ignore_notice:
        write(step=step, committed_step=None, emergency={"state": "saving", "step": step, "reason": None})
        d = os.path.join(local, "step_%012d" % step)
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "COMMITTED"), "w").close()
        write(step=step, committed_step=step, committed_kind="emergency", committed_durable="local",
              emergency={"state": "committed", "step": step, "reason": None})
        print("emergency checkpoint committed at step", step, flush=True)
        sys.exit(75)
    write(step=step, committed_step=None)
print("tiny trainer done", flush=True)
'''


def settings(command: list[str], checkpoint_uri: str, **extra: Any) -> dict[str, Any]:
    base = {"command": command, "checkpoint_uri": checkpoint_uri, "env": {}, "heartbeat_seconds": 0.5,
            "notice_budget_seconds": 20, "metadata_wait_seconds": 2}
    base.update(extra)
    return base


def attributes(job_id: str, attempt: int, project: str, s: dict[str, Any]) -> dict[str, str]:
    return {"respawn-job-id": job_id, "respawn-attempt": str(attempt), "respawn-project": project,
            "respawn-settings": json.dumps(s)}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"gave up waiting after {timeout:.0f} s for: {what}")


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.2)


class AgentProcess:
    """One `python -m respawn.agent` process with its own process group and cwd = the node directory."""

    def __init__(self, node_dir: Path, metadata_host: str, extra_env: dict[str, str] | None = None):
        self.node_dir = node_dir
        node_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = node_dir.parent / f"{node_dir.name}-agent-stdout-{time.monotonic_ns()}.log"
        env = dict(os.environ, GCE_METADATA_HOST=metadata_host, RESPAWN_NODE_DIR=str(node_dir),
                   PYTHONPATH=str(REPO))
        env.update(extra_env or {})
        self._out = open(self.stdout_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "respawn.agent"], cwd=node_dir, env=env,
                                     stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not exit within {timeout} s; output:\n{self.output()[-4000:]}")

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.output().splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "severity" in obj:
                out.append(obj)
        return out

    def messages(self) -> list[str]:
        return [e["message"] for e in self.events()]

    def has(self, message: str) -> bool:
        return message in self.messages()

    def trainer_record(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.node_dir / "trainer.json").read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc.pid)
            self.proc.wait(10)
        self._out.close()


@pytest.fixture
def agent_env(tmp_path, firestore_db, project):
    """Starts metadata servers and agents for one test and stops all of them (and their trainers) afterwards."""

    class Env:
        def __init__(self):
            self.servers: list[MetadataServer] = []
            self.agents: list[AgentProcess] = []
            self.db = firestore_db
            self.project = project
            self.tmp = tmp_path
            self.tiny_trainer = tmp_path / "tiny_trainer.py"
            self.tiny_trainer.write_text(TINY_TRAINER)

        def metadata(self, node: str, attrs: dict[str, str]) -> MetadataServer:
            md = MetadataServer(name=node, zone="us-central1-a", project=project, attributes=attrs).start()
            self.servers.append(md)
            return md

        def agent(self, md: MetadataServer, node_dir: Path, **env: str) -> AgentProcess:
            a = AgentProcess(node_dir, md.host, env)
            self.agents.append(a)
            return a

        def heartbeat(self, node: str) -> dict[str, Any] | None:
            return self.db.document(f"nodes/{node}").get().to_dict()

    env = Env()
    yield env
    for a in env.agents:
        a.stop()
        record = a.trainer_record()
        if record and TrainerRecord(**record).alive():  # only a trainer this test started and still running
            _kill_group(record["pid"])
    for md in env.servers:
        md.stop()
