"""Per-attempt logs (node_agent/logship.py): the real agent ships its setup's, its trainer's and its own output to
the job's checkpoint_uri in chunks as it runs (file:/// and the Cloud Storage emulator), a preempted node's logs are
read by `respawn jobs logs` after its replacement ran, and the final flush of a notice never delays the emergency
save or the final heartbeat, however slow the store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401
from respawn import contract

ROOT = Path(__file__).resolve().parents[1]


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
    assert "trainer finished successfully" in [e["message"] for e in agent_lines]
