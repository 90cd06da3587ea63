"""Helpers for the node agent tests: a per-test metadata server (sim.metadata), the agent as a real process
(`python -m respawn.agent`, as the sim and systemd run it), and a tiny trainer that follows the trainer library's
contract (status file, SIGTERM → emergency checkpoint → exit 75) for the agent's own mechanics.

The agent runs on each node image's own `python3`: 3.9 (Debian 11 Deep Learning VM), 3.10 (Ubuntu 22.04, the TPU
runtimes), 3.11, 3.12. `node_python` gives a test each of those found on this machine (the older ones bare, with
nothing but the installed `respawn/` tree on PYTHONPATH), and the current interpreter with the editable install."""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import pytest

from deploy import layout
from respawn.agent.supervisor import TrainerRecord
from respawn.contract import ENV_PEER_PORT, NODES_COLLECTION
from sim.emulators import free_port
from sim.metadata import MetadataServer

REPO = Path(__file__).resolve().parent.parent

# The node images' older Pythons (pyenv builds on the dev machine; `python3.X` on PATH elsewhere).
OLD_NODE_PYTHONS = ("3.9", "3.10")


@functools.lru_cache(maxsize=None)
def find_python(version: str) -> str | None:
    """An interpreter of `version` (e.g. "3.9") that really runs (a pyenv shim on PATH may not), or None."""
    candidates = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")),
                        reverse=True)
    candidates.append(shutil.which(f"python{version}") or "")
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return exe
    return None


def installed_tree(dest: Path) -> Path:
    """The respawn.* namespace laid out as the wheel installs it (pyproject.toml's package-dir), every module of
    it: respawn/, respawn/agent/ (node_agent/), respawn/control/ (functions/), respawn/ckpt/ (trainer/). An old
    interpreter with only this on its path has no pydantic, NumPy or Google libraries, so the agent runs there only
    if importing respawn.agent touches nothing but the standard library, respawn.contract and respawn.logs."""
    for package, folder in layout.package_dirs().items():  # respawn first: the subpackages go inside it
        shutil.copytree(folder, dest.joinpath(*package.split(".")),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    return dest


class NodePython(NamedTuple):
    """How to start the agent: the interpreter and the PYTHONPATH that makes `respawn` importable."""

    label: str  # "3.9", "3.10" or "current"
    executable: str
    pythonpath: str


@pytest.fixture(scope="session")
def agent_tree(tmp_path_factory) -> Path:
    return installed_tree(tmp_path_factory.mktemp("installed") / "site")


@pytest.fixture(params=[*OLD_NODE_PYTHONS, "current"])
def node_python(request) -> NodePython:
    """Each node image's Python: the older ones bare, with only the installed tree; the current one as usual."""
    if request.param == "current":
        return NodePython("current", sys.executable, str(REPO))
    return NodePython(request.param, node_image_python(request.param), str(request.getfixturevalue("agent_tree")))


def node_image_python(version: str) -> str:
    """The interpreter of an older node image; its absence fails the run with how to get it (never a skip)."""
    exe = find_python(version)
    if exe is None:
        pytest.fail(f"no working python{version} on this machine: the node images run it; install it, e.g. "
                    f"`pyenv install {version}`", pytrace=False)
    return exe


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


@contextlib.contextmanager
def gcs_standin(tmp_path: Path, *args: str) -> Iterator[tuple[str, Path]]:
    """tests/gcs_standin.py with `args` (a Cloud Storage that answers as told, slowly if asked): (its
    STORAGE_EMULATOR_HOST value, its request log)."""
    log = tmp_path / "standin.log"
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "gcs_standin.py"), *args, "--log", str(log)],
                            stdout=subprocess.PIPE, text=True)
    port = proc.stdout.readline().strip()
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(10)


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

    def __init__(self, node_dir: Path, metadata_host: str, extra_env: dict[str, str] | None = None, *,
                 python: NodePython | None = None):
        self.node_dir = node_dir
        self.python = python or NodePython("current", sys.executable, str(REPO))
        node_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = node_dir.parent / f"{node_dir.name}-agent-stdout-{time.monotonic_ns()}.log"
        env = dict(os.environ, GCE_METADATA_HOST=metadata_host, RESPAWN_NODE_DIR=str(node_dir),
                   PYTHONPATH=self.python.pythonpath)
        env.update(extra_env or {})
        self._out = open(self.stdout_path, "wb")
        self.proc = subprocess.Popen([self.python.executable, "-m", "respawn.agent"], cwd=node_dir, env=env,
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
def agent_env(tmp_path, firestore_db, nodes_db, project):
    """Starts metadata servers and agents for one test and stops all of them (and their trainers) afterwards."""

    class Env:
        def __init__(self):
            self.servers: list[MetadataServer] = []
            self.agents: list[AgentProcess] = []
            self.db = firestore_db
            self.nodes_db = nodes_db
            self.project = project
            self.tmp = tmp_path
            self.tiny_trainer = tmp_path / "tiny_trainer.py"
            self.tiny_trainer.write_text(TINY_TRAINER)

        def metadata(self, node: str, attrs: dict[str, str]) -> MetadataServer:
            md = MetadataServer(name=node, zone="us-central1-a", project=project, attributes=attrs).start()
            self.servers.append(md)
            return md

        def agent(self, md: MetadataServer, node_dir: Path, *, python: NodePython | None = None,
                  **env: str) -> AgentProcess:
            """Start `python -m respawn.agent` with `python` (default: this interpreter and the checkout). A member's
            agent serves its checkpoints on a free port of its own (agents side by side share 127.0.0.1)."""
            env.setdefault(ENV_PEER_PORT, str(free_port()))
            a = AgentProcess(node_dir, md.host, env, python=python)
            self.agents.append(a)
            return a

        def heartbeat(self, node: str) -> dict[str, Any] | None:
            return self.nodes_db.collection(NODES_COLLECTION).document(node).get().to_dict()

    env = Env()
    yield env
    for a in env.agents:
        a.stop()
        record = a.trainer_record()
        if record and TrainerRecord(**record).alive():  # only a trainer this test started and still running
            _kill_group(record["pid"])
    for md in env.servers:
        md.stop()
