"""A fresh node copies the newest committed checkpoint to its disk while setup runs (issue #25, item 3): the trainer
starts with it there, committed and verified, and its restore reads the disk. A real agent, the storage emulator."""

from __future__ import annotations

import json
import os
import sys

import torch
from agent_fixtures import agent_env, attributes, settings  # noqa: F401  (agent_env: a fixture)
from respawn.ckpt import CheckpointManager
from respawn.ckpt import format as fmt
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401 - fixtures


def test_the_newest_committed_step_is_on_the_disk_before_the_trainer_starts(agent_env, gcs, gcs_emulator, tmp_path):
    uri = f"gs://{BUCKET}/jobs/prefetch"
    writer = CheckpointManager(uri, str(tmp_path / "writer"))
    for step in (3, 7):
        assert writer.save(step, {"w": torch.full((4096,), float(step))}, blocking=True).durable == "remote"
    seen = tmp_path / "seen.json"
    look = (f"import json, os; d = os.environ['RESPAWN_LOCAL_CHECKPOINT_DIR']; "
            f"json.dump(sorted(os.listdir(d)), open({str(seen)!r}, 'w'))")
    s = settings([sys.executable, "-c", look], uri, setup=[["python", "-c", "import time; time.sleep(1)"]],
                 interpreter=sys.executable)
    md = agent_env.metadata("pf-1", attributes("pf", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "pf-1", STORAGE_EMULATOR_HOST=gcs_emulator)
    assert agent.wait(120) == 0
    assert json.loads(seen.read_text()) == [fmt.step_dirname(7)]  # the newest alone, before the trainer ran
    assert fmt.verify(str(agent_env.tmp / "pf-1" / "checkpoints" / fmt.step_dirname(7)))["step"] == 7
    [stage] = [e for e in agent.events() if e.get("stage") == "checkpoint_prefetch"]
    assert stage["seconds"] >= 0
    assert any(e["message"].startswith("prefetching the newest committed checkpoint") for e in agent.events())
    assert os.listdir(tmp_path / "writer")  # the writer's own copies untouched
