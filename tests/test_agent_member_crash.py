"""A multi-node member's agent when a peer's trainer crashed: its own trainer, blocked for real in a gloo
collective with the peer (torchrun under the launch wrapper, as the nodes run it), is stopped and restarted in the
next generation quickly, not at the process group's timeout (30 min) nor torchrun's shutdown wait (30 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (agent_env: a fixture)
from respawn.agent.supervisor import processes_with
from respawn.contract import ENV_CHECKPOINT_URI, ENV_GENERATION, Generation
from sim.emulators import free_port

# Rank 0 is the agent's trainer; rank 1, the peer, is started by the test and stops taking part at HANG_AT_STEP
# while its process (and its sockets) lives on, as a trainer stuck in its own error handling or a wedged device
# would: rank 0 blocks in the step's all_reduce. A SIGTERM handler that ran would print and exit 75.
COLLECTIVE_TRAINER = r'''
import json, os, signal, sys, time
import torch, torch.distributed as dist
handled = []
signal.signal(signal.SIGTERM, lambda *_: (handled.append(1), print("SIGTERM handler ran", flush=True)))
dist.init_process_group("gloo")
rank, hang_at, status = dist.get_rank(), int(os.environ.get("HANG_AT_STEP") or 0), os.environ.get("RESPAWN_STATUS_FILE")
print("rank", rank, "of", dist.get_world_size(), flush=True)
t = torch.ones(4)
for step in range(1, 1000000):
    if step == hang_at:
        print("peer stops taking part at step", step, flush=True)
        while True:
            time.sleep(1)
    dist.all_reduce(t)
    if status:
        with open(status + ".tmp", "w") as f:
            json.dump({"step": step, "committed_step": None, "total_steps": None, "updated_at": time.time(),
                       "pid": os.getpid(), "emergency": {"state": "idle", "step": None, "reason": None}}, f)
        os.replace(status + ".tmp", status)
    if handled:
        sys.exit(75)
    time.sleep(0.02)
'''


def generation_processes(number: str, store: str) -> list[int]:
    """The live processes this test's agent started for generation `number` (the agent puts RESPAWN_GENERATION and the
    job's checkpoint URI in their environment; other tests' trainers run meanwhile, in their own generation 1)."""
    mine = set(processes_with(f"{ENV_CHECKPOINT_URI}={store}".encode()))
    return sorted(mine.intersection(processes_with(f"{ENV_GENERATION}={number}".encode())))


def test_a_generation_restarted_for_a_peers_crash_kills_the_trainer_blocked_in_a_collective(agent_env, tmp_path):
    port = free_port()
    script = tmp_path / "collective_trainer.py"
    script.write_text(COLLECTIVE_TRAINER)
    launch = [sys.executable, "-m", "respawn.ckpt.launch", sys.executable, "-m", "torch.distributed.run",
              "--nproc-per-node", "1", "--master-port", str(port), str(script)]
    store = f"file://{tmp_path}/store"
    s = settings(launch, store, env={"GLOO_SOCKET_IFNAME": "lo"})
    md = agent_env.metadata("mc-1", {**attributes("mc", 1, agent_env.project, s), "respawn-generation": ""})
    node_dir = tmp_path / "mc-1"
    agent = agent_env.agent(md, node_dir)
    peer_dir = tmp_path / "peer"
    peer_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "PET_"))}
    peer = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
                             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                             str(script)], cwd=peer_dir, env={**env, "GLOO_SOCKET_IFNAME": "lo", "HANG_AT_STEP": "30",
                                                              "PEER_OF": str(tmp_path)},
                            stdout=open(peer_dir / "out.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (agent_env.heartbeat("mc-1") or {}).get("state") == "waiting", 60, "the member waiting")
        generation = Generation(1, ("mc-1", "mc-2"), "127.0.0.1")
        md.set_attribute("respawn-generation", generation.to_json())
        wait_for(lambda: "peer stops taking part" in (peer_dir / "out.log").read_text(), 120, "the peer at its step")
        # Rank 0 ran step 29 and is blocked in step 30's all_reduce: its step stays at 29.
        wait_for(lambda: (agent_env.heartbeat("mc-1") or {}).get("step") == 29, 30, "the trainer blocked at step 30")
        time.sleep(1.0)
        assert (agent_env.heartbeat("mc-1") or {}).get("step") == 29

        # The control plane restarts the same members (the peer's trainer crashed, as its member reported).
        began = time.monotonic()
        md.set_attribute("respawn-generation", Generation(2, generation.members, generation.master_addr).to_json())
        wait_for(lambda: any(e["message"] == "trainer started" and e.get("generation") == 2 for e in agent.events()),
                 60, "generation 2's trainer started")
        took = time.monotonic() - began
        print(f"\ngeneration 2's trainer started {took:.1f} s after the restart was written (the blocked trainer "
              f"killed after the agent's grace; torchrun alone waits 30 s, gloo's timeout is 30 min)")
        hb = wait_for(lambda: (h := agent_env.heartbeat("mc-1") or {}).get("generation") == 2 and h, 30,
                      "a heartbeat of generation 2")
        assert hb["state"] == "training"
        stops = [e for e in agent.events() if e["message"].startswith("the trainer did not stop within")]
        assert len(stops) == 1 and "blocked in a collective" in stops[0]["message"], agent.messages()
        ended = [e for e in agent.events() if e["message"] == "trainer ended; waiting for the next generation"]
        assert ended and ended[0]["generation"] == 1 and ended[0]["exit_code"] == 128 + signal.SIGKILL
        # Blocked in the collective, the trainer never ran its SIGTERM handler: only the kill could stop it.
        assert "SIGTERM handler ran" not in (node_dir / "trainer.log").read_text()
        # torchrun runs its worker in a session of its own: the kill reached it all the same (a worker left behind
        # would hold its memory, its device and its peers until gloo's timeout).
        # SIGKILLed at once, each is gone once the kernel has torn it down: seconds for a process holding torch's
        # memory on a loaded machine (CI: 10 s were not always enough), never for one the kill missed.
        try:
            wait_for(lambda: not generation_processes("1", store), 30, "generation 1's processes gone", interval=0.2)
        except AssertionError:
            left = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-p", ",".join(map(str, generation_processes("1", store)))
                                   or "1"], capture_output=True, text=True).stdout
            raise AssertionError(f"generation 1's processes outlived its kill: {left}") from None
    finally:
        # The peer's torchrun and its worker, which runs in a session of its own (the group's kill misses it).
        for pid in processes_with(f"PEER_OF={tmp_path}".encode()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        peer.wait(10)
