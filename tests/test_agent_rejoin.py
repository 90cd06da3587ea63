"""Survivors keep their processes (issue #25): a multi-node member whose trainer runs TrainingLoop with on_rejoin is
handed a generation of new members and goes on in the same process, bit-identical to an uninterrupted run; a trainer
that cannot rejoin is restarted as before. Real agents, real torch gloo trainers on this machine; the pure parts
of the hand-over below them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (agent_env: a fixture)
from respawn import contract
from respawn.agent.supervisor import TrainerProcess, TrainerRecord
from respawn.contract import Generation, Rejoin
from sim.emulators import free_port, free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, EVERY = 60, 25

# One process per node (no torchrun): DDP over gloo, the example MLP; join() builds what depends on the world, at
# the start and, given as on_rejoin, in every new world. --plain: no on_rejoin (restarted for every generation).
TRAINER = r'''
import argparse, os, time
import numpy as np, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from respawn.ckpt import CheckpointManager, TrainingLoop, collective_timeout
from respawn.ckpt.examples._common import BATCH, N, next_batch
from respawn.ckpt.examples.torch_ddp import _rank_ordered_mean
from respawn.ckpt.examples.torch_mlp import MLP, regression_data

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int)
p.add_argument("--every", type=int)
p.add_argument("--step-seconds", type=float, default=0.0)
p.add_argument("--final-params")
p.add_argument("--plain", action="store_true")
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=collective_timeout())
print("rejoin trainer: pid", os.getpid(), "rank", dist.get_rank(), "of", dist.get_world_size(), flush=True)
torch.manual_seed(7)
x, y = regression_data(7)
mlp = MLP(1)
opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
shuffle = torch.Generator().manual_seed(8)
data = {"epoch": 0, "pos": 0, "perm": torch.randperm(N, generator=shuffle)}
world = {}

def join():  # DDP binds the process group it is built on; this rank's part of the global batch follows the rank
    rank, size = dist.get_rank(), dist.get_world_size()
    world["model"] = DistributedDataParallel(mlp)
    world["model"].register_comm_hook(None, _rank_ordered_mean)
    world["part"], world["size"] = slice(rank * BATCH // size, (rank + 1) * BATCH // size), size

join()
mgr = CheckpointManager.from_env(total_steps=a.steps)
with TrainingLoop(a.steps, every=a.every, manager=mgr, model=mlp, optimizer=opt, data=data, shuffle=shuffle,
                  on_rejoin=None if a.plain else join) as loop:
    print("rejoin trainer: starting at step", loop.start, flush=True)
    for step in loop:
        idx = next_batch(data, lambda: torch.randperm(N, generator=shuffle))
        part = world["part"]
        loss = ((world["model"](x[idx])[part] - y[idx][part]) ** 2).sum() * (world["size"] / BATCH)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        time.sleep(a.step_seconds)
if a.final_params and dist.get_rank() == 0:
    np.savez(a.final_params, **{k: v.detach().numpy() for k, v in mlp.state_dict().items()})
print("rejoin trainer: done, pid", os.getpid(), flush=True)
dist.destroy_process_group()
'''


def _trainer_argv(script, final, step_seconds: float = 0.0) -> list[str]:
    return [sys.executable, str(script), "--steps", str(STEPS), "--every", str(EVERY), "--step-seconds",
            str(step_seconds), "--final-params", str(final)]


def _reference(tmp_path, script) -> list[subprocess.Popen]:
    """The uninterrupted run: two processes, one world, the same seed and steps."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "PET_"))}
        env.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", RESPAWN_CHECKPOINT_URI=f"file://{tmp_path}/ref/store",
                   RESPAWN_LOCAL_CHECKPOINT_DIR=f"{tmp_path}/ref/local{rank}",
                   **contract.torch_env(rank, 2, "127.0.0.1", port))
        out = open(tmp_path / f"ref{rank}.log", "wb")
        procs.append(subprocess.Popen(_trainer_argv(script, tmp_path / "ref.npz"), env=env, cwd=tmp_path,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def _status(node_dir) -> dict:
    return contract.read_status(str(node_dir / contract.STATUS_FILE)) or {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's final parameters, one run for both ways B leaves (the same script, seed and steps):
    started as the first test starts, read once it has ended."""
    tmp = tmp_path_factory.mktemp("rejoin-reference")
    script = tmp / "rejoin_trainer.py"
    script.write_text(TRAINER)
    procs = _reference(tmp, script)
    ended = []

    def final() -> dict:
        if not ended:
            for proc, rank in zip(procs, (0, 1)):
                assert proc.wait(60) == 0, (tmp / f"ref{rank}.log").read_text()[-3000:]
            ended.append(dict(np.load(tmp / "ref.npz")))
        return ended[0]

    yield final
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["notice", "generation"])
def test_a_survivor_rejoins_the_next_generation_in_its_process_bit_identical(agent_env, tmp_path, how, reference):
    """B leaves: `notice`, B is preempted (the world stops at B's notice, A waits in its process for the next
    generation); `generation`, the control plane writes a generation without B first (A's agent hands it to A's
    running trainer, B's agent stops B's)."""
    script = tmp_path / "rejoin_trainer.py"
    script.write_text(TRAINER)
    # The generations' ports: base + number (contract.generation_port), away from 29500 and other tests.
    s = settings(_trainer_argv(script, tmp_path / "got.npz", step_seconds=0.1), f"file://{tmp_path}/store",
                 env={"GLOO_SOCKET_IFNAME": "lo", "MASTER_PORT": str(free_ports(3))})  # generations 1, 2 free
    nodes = {}
    for name in ("rj-1", "rj-2", "rj-3"):  # A survives, B is preempted, C replaces it
        md = agent_env.metadata(name, {**attributes("rj", int(name[-1]), agent_env.project, s),
                                       contract.ATTR_GENERATION: ""})
        nodes[name] = (md, tmp_path / name, agent_env.agent(md, tmp_path / name))
    (md_a, dir_a, agent_a), (md_b, dir_b, agent_b), (md_c, dir_c, agent_c) = nodes.values()
    for name in nodes:
        wait_for(lambda: (agent_env.heartbeat(name) or {}).get("state") == "waiting", 60, f"{name} waiting")
    # Generation 1: B is the master (rank 0, the writer), A rank 1.
    g1 = Generation(1, ("rj-2", "rj-1"), "127.0.0.1")
    for md in (md_a, md_b):
        md.set_attribute(contract.ATTR_GENERATION, g1.to_json())
    wait_for(lambda: (_status(dir_a).get("step") or 0) >= 10, 60, "A training in generation 1")
    before = _status(dir_a)
    assert before["rejoin"] == "ready" and before["generation"] == 1, before
    pid = before["pid"]

    # Generation 2: A is the master now (rank 0, the writer), C, new, rank 1.
    g2 = Generation(2, ("rj-1", "rj-3"), "127.0.0.1")
    if how == "notice":
        md_b.set("instance/preempted", "TRUE")  # the world stops at one step, B saves it and goes
        assert agent_b.wait(60) == 0
        wait_for(lambda: _status(dir_a).get("rejoin") == "waiting", 30, "A's trainer waiting, its world left")
    for md in (md_a, md_c) if how == "notice" else (md_a, md_b, md_c):
        md.set_attribute(contract.ATTR_GENERATION, g2.to_json())
    saved = wait_for(lambda: (e := _status(dir_b).get("emergency") or {}).get("state") not in (None, "idle",
                                                                                              "saving") and e,
                     60, "B's emergency save")
    assert saved["state"] == "committed", saved
    wait_for(lambda: (agent_env.heartbeat("rj-1") or {}).get("generation") == 2, 30, "A's beat in generation 2")
    assert agent_a.wait(90) == 0, agent_a.output()[-3000:]
    assert agent_c.wait(60) == 0, agent_c.output()[-3000:]
    ref = reference()

    # A's trainer is one process from the first step to the last, through both generations.
    log_a = (dir_a / "trainer.log").read_text()
    assert re.findall(r"rejoin trainer: pid (\d+)", log_a) == [str(pid)], log_a[-3000:]
    assert f"rejoin trainer: done, pid {pid}" in log_a
    assert [e.get("generation") for e in agent_a.events() if e["message"] == "trainer started"] == [1]
    assert agent_a.has("the trainer left its world and joins the new generation in its process")
    rejoined = [json.loads(line) for line in log_a.splitlines() if '"rejoined: training on in this process"' in line]
    # Every rank at the same step: B's emergency save, A's step in its memory (not read again), C's restore.
    assert [(r["step"], r["reloaded"], r["pid"]) for r in rejoined] == [(saved["step"], False, pid)], rejoined
    assert f"rejoin trainer: starting at step {saved['step']}" in (dir_c / "trainer.log").read_text()
    assert 0 < saved["step"] < STEPS

    got = np.load(tmp_path / "got.npz")
    assert sorted(ref) == sorted(got.files)
    for k in ref:
        assert ref[k].tobytes() == got[k].tobytes(), f"parameter {k} differs from the uninterrupted run"


def test_a_trainer_that_cannot_rejoin_is_restarted_for_new_members(agent_env, tmp_path):
    """A plain script (the status file's contract, no TrainingLoop): a generation of new members stops it and starts
    a new process, as before."""
    s = settings([sys.executable, str(agent_env.tiny_trainer), "--step-seconds", "0.05"], f"file://{tmp_path}/store")
    md = agent_env.metadata("pl-1", {**attributes("pl", 1, agent_env.project, s), contract.ATTR_GENERATION: ""})
    agent = agent_env.agent(md, tmp_path / "pl-1")
    wait_for(lambda: (agent_env.heartbeat("pl-1") or {}).get("state") == "waiting", 60, "the member waiting")
    md.set_attribute(contract.ATTR_GENERATION, Generation(1, ("pl-1",), "127.0.0.1").to_json())
    wait_for(lambda: (_status(tmp_path / "pl-1").get("step") or 0) >= 5, 30, "training in generation 1")
    md.set_attribute(contract.ATTR_GENERATION, Generation(2, ("pl-1", "pl-9"), "127.0.0.1").to_json())
    wait_for(lambda: (agent_env.heartbeat("pl-1") or {}).get("generation") == 2, 30, "generation 2's trainer")
    started = [e for e in agent.events() if e["message"] == "trainer started"]
    assert [e["generation"] for e in started] == [1, 2] and started[0]["pid"] != started[1]["pid"]
    assert not agent.has("new generation: handing it to the trainer, which rejoins in its process")
    ended = [e for e in agent.events() if e["message"] == "trainer ended; waiting for the next generation"]
    assert [e["exit_code"] for e in ended] == [contract.EXIT_PREEMPTED]


# ---- the pure parts ---------------------------------------------------------------------------------------------

def test_rejoin_file_round_trips_and_refuses_what_is_not_one():
    r = Rejoin(3, {"RANK": "1", "MASTER_PORT": "29503"})
    assert Rejoin.from_json(r.to_json()) == r
    for bad in ("", "[]", '{"generation": 0, "env": {}}', '{"generation": true, "env": {}}',
                '{"generation": 2, "env": {"RANK": 1}}', '{"generation": 2}'):
        with pytest.raises(ValueError, match=contract.REJOIN_FILE):
            Rejoin.from_json(bad)


def test_read_rejoin_is_none_until_a_complete_file_is_there(tmp_path):
    path = tmp_path / contract.REJOIN_FILE
    assert contract.read_rejoin(str(path)) is None
    path.write_text('{"generation": 2, "env"')
    assert contract.read_rejoin(str(path)) is None
    path.write_text(Rejoin(2, {}).to_json())
    assert contract.read_rejoin(str(path)) == Rejoin(2, {})


def test_each_generation_has_a_port_of_its_own_and_torchs_variables():
    assert [contract.generation_port(n) for n in (1, 2, 100, 101)] == [29501, 29502, 29500, 29501]
    assert contract.generation_port(7, base=40000) == 40007
    assert contract.torch_env(1, 3, "10.0.0.5", 29507) == {
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29507", "RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1"}


def test_the_agent_signals_only_a_live_process_of_the_trainers_group(tmp_path):
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        record = TrainerRecord(pid=child.pid, start_time=None, boot_id="b", job_id="j", attempt=1, log_offset=0,
                               started_at="2026-01-01T00:00:00+00:00")
        trainer = TrainerProcess(str(tmp_path), record, child=child)
        assert trainer.owns(child.pid)
        assert not trainer.owns(os.getpid())  # alive, but in another process group
        for bad in (None, True, 0, -1, "12"):
            assert not trainer.owns(bad)
    finally:
        child.kill()
        child.wait()
    assert not trainer.owns(child.pid)  # gone


def test_a_loop_declares_it_can_rejoin_only_where_it_can(monkeypatch):
    from respawn.ckpt import distributed

    monkeypatch.delenv(contract.ENV_REJOIN_FILE, raising=False)
    assert "unset" in distributed.can_rejoin(None)
    monkeypatch.setenv(contract.ENV_REJOIN_FILE, "/tmp/x")
    assert "replicated" in distributed.can_rejoin(None)  # a single process: no job, nothing to rejoin
