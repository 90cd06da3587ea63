"""The notice on the process trees real trainers make (issue #45): DataLoader workers under fork, spawn and
forkserver, persistent workers, torchdata's StatefulDataLoader and a helper process of the trainer's own, all in one
trainer started by a shell script that runs python without `exec`; torchrun with workers in every rank, and a second
SIGTERM a second after the first; loader workers that die during the notice, and a save that fails. Each tree runs
tests/notice_tree_trainer.py (a tiny model, synthetic data, gloo on CPU) as real processes, under the launch wrapper
as by hand (SIGTERM to the wrapper) and under the real node agent (a preemption notice on its metadata server), and
must stop with a committed emergency checkpoint of the step every rank reached, its loader workers (of every kind)
alive at the notice, and exit 75 — or 76 and the reason, per rank, when the save failed.

Before the notice went to the processes that save (contract.deliver_notice), it went to the trainer's whole process
group: the loader workers died of it (torch's worker handler), then torch's SIGCHLD handler raised in the main
thread, and a shell that did not exec died at once (143) while python still saved. These tests fail on that.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fixtures import agent_env, attributes, settings, wait_for  # noqa: F401  (fixture)
from respawn import contract
from trainer_helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
TRAINER = [sys.executable, str(ROOT / "tests" / "notice_tree_trainer.py")]
SIGNAL_AT = 8  # the notice comes once rank 0 has done this many steps


def reached(output: str) -> bool:
    """Rank 0 has printed step SIGNAL_AT: its line, wherever another rank's write landed in it (two ranks share the
    log; a line's text and its newline can arrive apart)."""
    return re.search(rf"step {SIGNAL_AT} rank 0(?!\d)", output) is not None


def torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1"]


def shell_without_exec(run: Path, args: list[str]) -> list[str]:
    script = run / "run.sh"
    script.write_text(f'#!/bin/bash\necho "starting the trainer"\n{" ".join(TRAINER)} "$@"\n')  # no exec
    return ["bash", str(script), *args]


def loaders(*kinds: str) -> list[str]:
    """A loader of each kind in one trainer (each read every step, each saved under a key of its own); the trainer
    prints each kind's count of workers alive at the notice."""
    return [arg for kind in kinds for arg in ("--loader", kind)]


# Every kind of loader worker in one trainer, with a helper process, started by bash without exec: the notice must
# reach none of them but the trainer. One tree for all (each kind of its own cost a trainer's start, seconds of torch
# imports). Under the agent, spawn workers (they import torch anew) in the same shell.
KINDS = ["fork", "spawn", "forkserver", "persistent", "stateful"]
EVERY_KIND_TREE = "every kind of worker, a helper, bash without exec"
SPAWN_TREE = "spawn workers, bash without exec"
KINDS_OF = {EVERY_KIND_TREE: KINDS, SPAWN_TREE: ["spawn"]}

# name: (the trainer's command in `run`, ranks)
TREES = {
    "fork workers": (lambda run: [*TRAINER, "--workers", "2"], 1),
    EVERY_KIND_TREE: (lambda run: shell_without_exec(run, ["--workers", "2", *loaders(*KINDS), "--helper"]), 1),
    SPAWN_TREE: (lambda run: shell_without_exec(run, ["--workers", "2", *loaders("spawn")]), 1),
    "torchrun, workers in every rank": (lambda run: [*torchrun(2), *TRAINER[1:], "--workers", "2"], 2),
}


def newest_committed(store: Path) -> tuple[int, str] | None:
    steps = sorted((int(m.group(1)), d) for d in store.glob("step_*") if (m := re.match(r"step_(\d+)$", d.name))
                   and (d / "COMMITTED").exists())
    if not steps:
        return None
    step, directory = steps[-1]
    return step, json.loads((directory / "manifest.json").read_text())["kind"]


def steps_reached(output: str, ranks: int) -> set[int]:
    """The last step each rank printed (not anchored to lines: two ranks' unbuffered writes may share one)."""
    last = {}
    for step, rank in re.findall(r"step (\d+) rank (\d)", output):
        last[rank] = int(step)
    assert len(last) == ranks, output[-3000:]
    return set(last.values())


def assert_saved_where_it_stopped(output: str, store: Path, name: str) -> int:
    ranks = TREES[name][1]
    reached = steps_reached(output, ranks)
    assert len(reached) == 1, f"the ranks stopped at different steps: {reached}"
    step = reached.pop()
    assert step >= SIGNAL_AT
    assert newest_committed(store) == (step, "emergency"), output[-3000:]
    alive = re.findall(r"loader workers alive at the notice: (\d+)/(\d+) rank \d", output)
    assert len(alive) == ranks and all(a == n != "0" for a, n in alive), alive  # the notice did not reach them
    if name in KINDS_OF:  # each kind's workers, by name
        kinds = re.findall(r"loader workers alive at the notice: \d+/\d+ rank 0 \((.*)\)", output)
        assert kinds == [" ".join(f"{kind} 2/2" for kind in KINDS_OF[name])], (kinds, output[-3000:])
    return step


# ---- under the launch wrapper, by hand ------------------------------------------------------------------------

def run_wrapped(tmp_path: Path, name: str, *extra: str, second_signal: bool = False) -> tuple[int, str, Path]:
    command, ranks = TREES[name]
    run = tmp_path / re.sub(r"\W+", "-", name)
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}  # by hand: no node agent
    env.update(PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo")
    log = run / "out.log"
    with open(log, "ab") as out:  # O_APPEND: the processes' writes never overwrite one another
        proc = subprocess.Popen([sys.executable, "-m", "respawn.ckpt.launch", *command(run), *extra], cwd=run,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:  # torchrun with 2 ranks and their 4 loader workers took over 120 s to step 8 in a loaded CI run
            wait_for(lambda: reached(log.read_text(errors="replace")) or proc.poll() is not None,
                     240, f"{name}: step {SIGNAL_AT}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its output:\n{log.read_text(errors='replace')[-3000:]}") from None
        proc.send_signal(signal.SIGTERM)  # `kill PID`, `docker stop`
        if second_signal:
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, log.read_text(errors="replace"), run / "respawn-checkpoints"


def test_the_notice_to_the_wrapper_becomes_a_committed_emergency_checkpoint(tmp_path):
    code, output, store = run_wrapped(tmp_path, EVERY_KIND_TREE)
    assert code == contract.EXIT_PREEMPTED, output[-3000:]
    assert_saved_where_it_stopped(output, store, EVERY_KIND_TREE)
    assert "starting the trainer" in output  # the shell ran, and did not exec


def test_a_second_sigterm_a_second_later_changes_nothing(tmp_path):
    # torchrun under the wrapper: one SIGTERM alone to this tree is test_trainer_launch_signals.py's (torch_ddp, whose
    # ranks read with loader workers) and the agent's below; this one proves that tree's save and exit as well.
    name = "torchrun, workers in every rank"
    code, output, store = run_wrapped(tmp_path, name, second_signal=True)
    assert code == contract.EXIT_PREEMPTED, output[-3000:]
    assert_saved_where_it_stopped(output, store, name)
    assert "SignalException" not in output  # torchrun itself never got a notice


def test_loader_workers_that_die_during_the_notice_do_not_cost_the_save(tmp_path):
    code, output, store = run_wrapped(tmp_path, "fork workers", "--kill-workers-on-notice")
    assert code == contract.EXIT_PREEMPTED, output[-3000:]
    step = steps_reached(output, 1).pop()
    assert newest_committed(store) == (step, "emergency")
    assert "loader workers alive at the notice: 0/2" in output  # killed, and the save committed anyway


def test_a_failed_emergency_save_exits_76_never_75(tmp_path):
    code, output, store = run_wrapped(tmp_path, "fork workers", "--unsaveable-on-notice")
    assert code == contract.EXIT_NOTICE_UNSAVED, output[-3000:]
    assert (newest_committed(store) or (0, ""))[1] != "emergency"
    assert "cannot serialize state" in output


# ---- under the node agent ---------------------------------------------------------------------------------------

AGENT_TREES = [SPAWN_TREE, "torchrun, workers in every rank"]


def run_under_agent(env, node: str, name: str, *extra: str) -> tuple[dict, str, Path]:
    command, ranks = TREES[name]
    run = env.tmp / f"{node}-files"
    run.mkdir()
    argv = command(run)
    if ranks > 1:
        argv = [sys.executable, "-m", "respawn.ckpt.launch", *argv]
    job, attempt = node.rsplit("-", 1)
    s = settings([*argv, *extra], f"file://{env.tmp / 'store'}", interpreter=sys.executable,
                 env={"PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"})
    md = env.metadata(node, attributes(job, int(attempt), env.project, s))
    agent = env.agent(md, env.tmp / node)
    log = env.tmp / node / "trainer.log"
    try:  # a loaded machine (the suite beside it) can take long to start torchrun's ranks and their workers
        wait_for(lambda: log.exists() and reached(log.read_text(errors="replace")), 180,
                 f"{name}: step {SIGNAL_AT} under the agent")
    except AssertionError as exc:  # say where it stood
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no trainer.log)"
        raise AssertionError(f"{exc}\ntrainer.log ends:\n{tail}\nthe agent's output ends:\n"
                             f"{agent.output()[-3000:]}") from None
    md.set("instance/preempted", "TRUE")
    assert agent.wait(60) == 0
    return env.heartbeat(node), log.read_text(errors="replace"), env.tmp / node / "checkpoints"


@pytest.mark.parametrize("name", AGENT_TREES)
def test_the_agents_notice_becomes_a_committed_emergency_checkpoint_in_every_rank(agent_env, name):
    node = f"tree-{AGENT_TREES.index(name) + 1}"
    hb, output, store = run_under_agent(agent_env, node, name)
    ranks = TREES[name][1]
    step = assert_saved_where_it_stopped(output, store, name)
    # The agent's heartbeat reads rank 0's status file: the job's committed step, its notice and its exit.
    assert (hb["state"], hb["notice"], hb["exit_code"]) == ("exited", "preempted", contract.EXIT_PREEMPTED), \
        output[-3000:]
    assert hb["committed_step"] == hb["step"] == step, hb
    emergency = hb["emergency"]
    assert (emergency["state"], emergency["step"]) == ("committed", step), emergency
    assert [(r["rank"] or 0, r["state"], r["step"]) for r in emergency["ranks"]] == \
        [(r, "committed", step) for r in range(ranks)]


def test_a_failed_save_under_the_agent_says_which_rank_and_why(agent_env):
    hb, output, _ = run_under_agent(agent_env, "tree-failed-1", "fork workers", "--unsaveable-on-notice")
    assert hb["exit_code"] == contract.EXIT_NOTICE_UNSAVED, output[-3000:]
    emergency = hb["emergency"]
    assert emergency["state"] == "failed" and emergency["reason"].startswith("rank 0: cannot serialize state"), \
        emergency
