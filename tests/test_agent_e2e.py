"""The node agent with the real example trainer (respawn.ckpt.examples.torch_mlp), the sim metadata server and the
Firestore emulator, all as real processes: the notice from each source, a flapping metadata server, a crash (the
tests' tiny trainer's), success, and a restart in place that uploads the previous life's local-only emergency
checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (fixture)
from respawn.contract import EXIT_PREEMPTED

TRAINER = [sys.executable, "-m", "respawn.ckpt.examples.torch_mlp", "--checkpoint-every", "50", "--log-every", "50",
           "--threads", "1"]


def _committed(store: Path, step: int) -> bool:
    return (store / f"step_{step:012d}" / "COMMITTED").exists()


def _start(env, node: str, extra_args: list[str], **extra):
    job, attempt = node.rsplit("-", 1)
    store = env.tmp / "store"
    # The trainer's interpreter runs the previous-life upload too: the one with the checkpoint library.
    s = settings(TRAINER + extra_args, f"file://{store}", interpreter=sys.executable, **extra)
    md = env.metadata(node, attributes(job, int(attempt), env.project, s))
    return md, env.tmp / node, store


def _training_past(env, node: str, step: int, agent=None):
    try:
        return wait_for(lambda: ((env.heartbeat(node) or {}).get("step") or 0) >= step, 120,
                        f"{node} heartbeating past step {step}")
    except AssertionError as exc:  # why it never got there: the agent's own account (the trainer's output is in it)
        told = "" if agent is None else f"\nthe agent's output (end):\n{agent.output()[-4000:]}"
        raise AssertionError(f"{exc}; last heartbeat {env.heartbeat(node)}{told}") from None


def _notice_reported(env, agent, node: str, node_dir: Path, source: str) -> None:
    """What an agent preempted by a notice from `source` past step 60 reported, and left on the node's disk."""
    # `preempting` was recorded (in the background) before the final `exited` heartbeat.
    written = [e["state"] for e in agent.events() if e["message"].endswith("heartbeat written")]
    assert written == ["preempting", "exited"], written
    hb = env.heartbeat(node)
    assert hb["state"] == "exited" and hb["notice"] == source
    emergency = hb["emergency"]
    assert emergency["state"] == "committed", emergency
    # The final heartbeat carries the emergency checkpoint as the newest committed step, and it really is
    # committed on the node's disk (and, time permitting, in the checkpoint store).
    assert hb["committed_step"] == emergency["step"] >= 60
    assert (node_dir / "checkpoints" / f"step_{emergency['step']:012d}" / "COMMITTED").exists()
    assert hb["exit_code"] == EXIT_PREEMPTED
    # The agent reported the notice within its budget: the deadline kill never happened.
    assert not agent.has("the trainer did not exit within the notice budget; killing its process group")
    assert "preempted at step" in agent.output()  # the trainer's own output, forwarded


# The notice from instance/preempted: the first life of the restart-in-place test below (one process tree fewer).
@pytest.mark.parametrize("source", ["maintenance-event", "sigterm"])
def test_notice_gets_emergency_checkpoint_committed_and_reported(agent_env, source):
    node = f"notice-{['preempted', 'maintenance-event', 'sigterm'].index(source) + 1}"
    md, node_dir, store = _start(agent_env, node, ["--steps", "100000", "--step-seconds", "0.01"])
    agent = agent_env.agent(md, node_dir)
    _training_past(agent_env, node, 60, agent)
    if source == "maintenance-event":
        md.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    else:
        os.kill(agent.proc.pid, signal.SIGTERM)  # systemd stopping the unit at shutdown
    assert agent.wait(60) == 0
    _notice_reported(agent_env, agent, node, node_dir, source)


def test_flapping_metadata_server_does_not_lose_the_notice(agent_env):
    md, node_dir, store = _start(agent_env, "flap-1", ["--steps", "100000", "--step-seconds", "0.03"],
                                 metadata_wait_seconds=1)
    agent = agent_env.agent(md, node_dir)
    _training_past(agent_env, "flap-1", 20)
    md.drop_next(4)
    md.fail_next(8, 503)
    reasons = lambda: [e.get("reason", "") for e in agent.events() if e["message"] == "metadata watch failed; reconnecting"]
    wait_for(lambda: any(r.startswith("HTTP 503") for r in reasons()), 60, "a 503 seen by a watcher")
    # Flip the key while the watchers are backing off: the ETag makes the next wait return the new value.
    md.set("instance/preempted", "TRUE")
    assert agent.wait(60) == 0
    assert any("Disconnected" in r or "Reset" in r for r in reasons()), reasons()
    hb = agent_env.heartbeat("flap-1")
    assert hb["notice"] == "preempted" and hb["emergency"]["state"] == "committed"
    assert hb["committed_step"] == hb["emergency"]["step"]


def test_crash_is_reported_with_exit_code_and_output_tail(agent_env):
    # The tests' tiny trainer (its argparse refuses the same way): what is reported does not depend on the trainer,
    # and the example would import torch only to refuse its arguments.
    s = settings([sys.executable, str(agent_env.tiny_trainer), "--steps", "not-a-number"],
                 f"file://{agent_env.tmp / 'store'}")
    md = agent_env.metadata("crash-1", attributes("crash", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "crash-1")
    assert agent.wait(120) == 0
    hb = agent_env.heartbeat("crash-1")
    assert hb["state"] == "exited" and hb["exit_code"] == 2 and hb["notice"] is None
    assert "invalid int value: 'not-a-number'" in hb["output_tail"]
    assert len(hb["output_tail"].encode()) <= 4096


def test_restart_in_place_uploads_local_only_checkpoint_then_resumes_and_succeeds(agent_env):
    md, node_dir, store = _start(agent_env, "life-1", ["--steps", "400", "--step-seconds", "0.01"])
    first = agent_env.agent(md, node_dir)
    _training_past(agent_env, "life-1", 60, first)
    md.set("instance/preempted", "TRUE")
    assert first.wait(60) == 0
    _notice_reported(agent_env, first, "life-1", node_dir, "preempted")  # the notice from instance/preempted
    step = agent_env.heartbeat("life-1")["emergency"]["step"]
    # As if the emergency checkpoint had no time to reach the store: it exists only on the node's disk.
    shutil.rmtree(store / f"step_{step:012d}", ignore_errors=True)
    assert not _committed(store, step)

    md.set("instance/preempted", "FALSE")  # the node is started again in place
    second = agent_env.agent(md, node_dir)
    assert second.wait(120) == 0
    assert second.has("uploading checkpoints left on this disk by a previous life")
    assert _committed(store, step)
    assert f"starting at step {step} of 400" in second.output()
    hb = agent_env.heartbeat("life-1")
    assert hb["state"] == "exited" and hb["exit_code"] == 0 and hb["notice"] is None
    assert hb["committed_step"] == 400 and hb["step"] == 400


def test_jax_example_gets_the_same_treatment(agent_env):
    job_store = agent_env.tmp / "store"
    command = [sys.executable, "-m", "respawn.ckpt.examples.jax_mlp", "--steps", "100000", "--step-seconds", "0.01",
               "--checkpoint-every", "50", "--threads", "1"]
    md = agent_env.metadata("jax-1", attributes("jax", 1, agent_env.project, settings(command, f"file://{job_store}")))
    agent = agent_env.agent(md, agent_env.tmp / "jax-1")
    _training_past(agent_env, "jax-1", 30)
    md.set("instance/preempted", "TRUE")
    assert agent.wait(60) == 0
    hb = agent_env.heartbeat("jax-1")
    assert hb["state"] == "exited" and hb["exit_code"] == EXIT_PREEMPTED and hb["emergency"]["state"] == "committed"
    assert hb["committed_step"] == hb["emergency"]["step"] >= 30
