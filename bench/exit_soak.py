"""A finished run exits 0, every time (#45 item 5): a soak, run by hand, not in CI.

    nice python -m bench.exit_soak --runs 20                      # every kind, 2 busy loops beside
    nice python -m bench.exit_soak --runs 5 --kinds hf,fsdp --at-once 2

For each kind (the HF Trainer, Lightning, Accelerate, TrainingLoop under DDP and under FSDP2: the repository's own
example trainers), `--runs` times: a 2-rank run from nothing to its last step (uninterrupted), then the same command
again on its checkpoints (already complete: it restores the last step and trains nothing). Both ranks are started as
torchrun starts them (env://, 127.0.0.1), beside `--busy` processes that spin on a core each (the load). A run counts
as good when both ranks exit 0 and the newest committed step is the total, and no step past it exists (an
already-complete run that trained one more step, as the HF Trainer did, is caught here). Prints one line per kind
(uninterrupted and already-complete runs good, out of how many) and, for each bad run, the ranks' exit codes
(-6: SIGABRT) and where its logs are kept. Each rank runs under tests/exit_threads.py: a run whose ranks still have
the worker threads of more than one gloo group (the trainer's default group) as the interpreter exits is bad too,
whatever its exit code: such a worker that still has a collective's tensors to let go of aborts the process there
(respawn.ckpt.collectives.release_group), which a few runs seldom show; the threads show it every time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, EVERY = 6, 4  # one periodic save, then the final one: every save path runs, in a few seconds


def command(kind: str, ckpt: str) -> list[str]:
    """The kind's trainer, its checkpoints in `ckpt` (by hand: no RESPAWN_* variables), run by tests/exit_threads.py,
    which prints the gloo worker threads still alive as the interpreter starts to exit."""
    py = [sys.executable, os.path.join(ROOT, "tests", "exit_threads.py")]
    if kind == "hf":
        return py + [os.path.join(ROOT, "examples", "workdir-hf", "train.py"), "--steps", str(STEPS),
                     "--save-steps", str(EVERY), "--output-dir", os.path.join(ckpt, "..", "hf-output")]
    if kind == "lightning":
        return py + [os.path.join(ROOT, "examples", "workdir-lightning", "train.py"), "--steps", str(STEPS),
                     "--checkpoint-every", str(EVERY), "--samples", "64"]
    if kind == "accelerate":
        return py + [os.path.join(ROOT, "tests", "test_integration_accelerate.py"), "--steps", str(STEPS),
                     "--every", str(EVERY), "--out", os.path.join(ckpt, "..", "weights.pt")]
    example = os.path.join(ROOT, "trainer", "examples", {"ddp": "torch_ddp.py", "fsdp": "torch_fsdp.py"}[kind])
    return py + [example, "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--checkpoint-dir", ckpt]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, run: str) -> list[subprocess.Popen]:
    """Both ranks, in `run` (the integrations' checkpoints go to ./respawn-checkpoints there)."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
        env.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        log = open(os.path.join(run, f"rank{rank}.log"), "ab")
        procs.append(subprocess.Popen(command(kind, os.path.join(run, "respawn-checkpoints")), cwd=run, env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def committed(ckpt: str) -> list[int]:
    from respawn.ckpt.storage import LocalStore

    return sorted(s for s, done in LocalStore(ckpt).steps().items() if done) if os.path.isdir(ckpt) else []


def steps_written(ckpt: str) -> list[int]:
    from respawn.ckpt.storage import LocalStore

    return sorted(LocalStore(ckpt).steps()) if os.path.isdir(ckpt) else []


def threads_left(run: str) -> list[dict]:
    """Each rank's last exit_threads line (the runs of a folder append to its logs)."""
    found = []
    for rank in (0, 1):
        with open(os.path.join(run, f"rank{rank}.log"), errors="replace") as f:
            lines = [line for line in f if line.startswith('{"exit_threads"')]
        found.append(json.loads(lines[-1])["exit_threads"] if lines else None)
    return found


def judge(run: str, codes: list[int]) -> str | None:
    """Why a finished run is bad, or None."""
    ckpt = os.path.join(run, "respawn-checkpoints")
    if codes != [0, 0]:
        return f"exit codes {codes}"
    threads = threads_left(run)
    # The trainer's own default group may live on (a DDP or FSDP2 model holds it): one group's threads at most.
    if any(t is None or t["at_exit"] > t["per_group"] for t in threads):
        return f"gloo threads of more than one group alive at exit: {threads}"
    done, written = committed(ckpt), steps_written(ckpt)
    if not done or done[-1] != STEPS or max(written) != STEPS:
        return f"committed {done}, written {written}: want the newest {STEPS} and none past it"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20, help="uninterrupted runs per kind, each then run again (20)")
    p.add_argument("--kinds", default="hf,lightning,accelerate,ddp,fsdp")
    p.add_argument("--busy", type=int, default=2, help="busy loops beside the runs (2)")
    p.add_argument("--at-once", type=int, default=1, help="runs at the same time (1)")
    p.add_argument("--keep", default=None, help="keep every run's folder here (default: only the bad runs')")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    work = args.keep or tempfile.mkdtemp(prefix="exit-soak-")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # `kill` ends the busy loops too (the finally below)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    tally = {(kind, phase): [0, 0] for kind in kinds for phase in ("uninterrupted", "complete")}
    bad: list[str] = []
    began = time.monotonic()
    try:
        queue = [(kind, i) for i in range(args.runs) for kind in kinds]
        while queue:
            batch, queue = queue[:args.at_once], queue[args.at_once:]
            runs = {}
            for kind, i in batch:
                runs[(kind, i)] = os.path.join(work, f"{kind}-{i}")
                os.makedirs(runs[(kind, i)])
            for phase in ("uninterrupted", "complete"):
                procs = {key: start(key[0], run) for key, run in runs.items()}
                for (kind, i), ranks in procs.items():
                    codes = [proc.wait() for proc in ranks]
                    why = judge(runs[(kind, i)], codes)
                    tally[(kind, phase)][0] += why is None
                    tally[(kind, phase)][1] += 1
                    if why is not None:
                        bad.append(f"{kind} run {i} ({phase}): {why}; logs in {runs[(kind, i)]}")
                        print(bad[-1], flush=True)
            done = sum(n for _, n in tally.values())
            print(f"[{(time.monotonic() - began) / 60:.1f} min] {done} runs, {len(bad)} bad: " + ", ".join(
                f"{kind} {tally[(kind, 'uninterrupted')][0]}+{tally[(kind, 'complete')][0]}/"
                f"{tally[(kind, 'uninterrupted')][1]}+{tally[(kind, 'complete')][1]}" for kind in kinds), flush=True)
            if args.keep is None:
                for key, run in runs.items():
                    if not any(f" logs in {run}" in line for line in bad):
                        shutil.rmtree(run, ignore_errors=True)
    finally:
        for proc in busy:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    minutes = (time.monotonic() - began) / 60
    print(f"exit soak: 2 ranks, {STEPS} steps, {args.busy} busy loops beside, {args.at_once} run(s) at once, "
          f"{minutes:.1f} min")
    for kind in kinds:
        (u, un), (c, cn) = tally[(kind, "uninterrupted")], tally[(kind, "complete")]
        print(f"  {kind:<11} uninterrupted {u}/{un} exit 0   already complete {c}/{cn} exit 0")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
