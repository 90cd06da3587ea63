"""Flags and the printed lines shared by the examples (framework-neutral). The checkpoint protocol itself is
respawn.ckpt.TrainingLoop's."""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from respawn.ckpt import Preempted, TrainingLoop

N, BATCH = 4096, 64  # the examples' data: N rows, global batches of BATCH
FAIL_AT_STEP_ENV = "EXAMPLE_FAIL_AT_STEP"
FAIL_RANK_ENV = "EXAMPLE_FAIL_RANK"


class InjectedFailure(RuntimeError):
    """The error --fail-at-step raises."""


def next_batch(data: dict, reshuffle: Callable[[], Any]):
    """The row indices of the next global batch, advancing the data position `data` (restored in place); a new epoch
    takes a new permutation, reshuffle(), from the checkpointed generator."""
    if data["pos"] + BATCH > N:
        data.update(epoch=data["epoch"] + 1, pos=0, perm=reshuffle())
    data["pos"] += BATCH
    return data["perm"][data["pos"] - BATCH:data["pos"]]


def _fail_once(name: str, args: argparse.Namespace, done: int) -> None:
    if not args.fail_at_step or done != args.fail_at_step or int(os.environ.get("RANK") or 0) != args.fail_rank:
        return
    marker = f".fail-at-step-{args.fail_at_step}.done"
    if os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write(f"{name} failed here once (--fail-at-step)\n")
    print(f"{name}: failing after step {done} (--fail-at-step {done})", flush=True)
    raise InjectedFailure(f"{name}: the failure --fail-at-step {done} asked for")


def parse_args(name: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m respawn.ckpt.examples.{name}",
                                description="Example trainer that survives preemption (see trainer/README.md). "
                                "Configured by RESPAWN_* environment variables when the node agent runs it.")
    p.add_argument("--steps", type=int, default=300, help="total training steps (default 300)")
    p.add_argument("--state-mb", type=float, default=0.0,
                   help="extra state ('ballast') in MiB added to the checkpoint, to test large flushes")
    p.add_argument("--checkpoint-every", type=int, default=50, help="periodic checkpoint interval in steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="extra sleep per step, so that a demo can preempt the run mid-way")
    p.add_argument("--keep", type=int, default=3, help="periodic checkpoints to keep")
    p.add_argument("--log-every", type=int, default=50, help="print a progress line every N steps")
    p.add_argument("--checkpoint-dir", default=os.path.join(".", "respawn-checkpoints", name),
                   help="checkpoint directory when RESPAWN_CHECKPOINT_URI/RESPAWN_LOCAL_CHECKPOINT_DIR are unset")
    p.add_argument("--final-params", default=None, help="write the final parameters here (.npz) when done")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for the framework (determinism, shared CPUs)")
    p.add_argument("--loader-workers", type=int, default=2,
                   help="the torch examples' DataLoader worker processes (default 2, as most jobs read)")
    # A fault to try recovery with (a demo scenario sets it through the job's trainer.env). Once: a marker file in
    # the working directory keeps the trainer restarted on the same node from failing again at the same step.
    p.add_argument("--fail-at-step", type=int, default=int(os.environ.get(FAIL_AT_STEP_ENV) or 0),
                   help="raise an error after this step (once per working directory), as a crashing trainer "
                   f"would; default ${FAIL_AT_STEP_ENV}, 0: never")
    p.add_argument("--fail-rank", type=int, default=int(os.environ.get(FAIL_RANK_ENV) or 0),
                   help=f"the global rank (RANK) that fails with --fail-at-step; default ${FAIL_RANK_ENV}, or 0")
    return p.parse_args(argv)


@contextmanager
def progress(name: str, args: argparse.Namespace, loop: TrainingLoop) -> Iterator[Callable[[int, float], None]]:
    """Prints `<name>: starting at step N of M`, a progress line every --log-every steps (through the function it
    yields, called after each step with the step just run and its loss; it also sleeps --step-seconds), and
    `<name>: preempted at step N; ...` or `<name>: done, final step M` (tests and the demo read these lines).
    With --fail-at-step, the chosen rank raises InjectedFailure after that step (once)."""
    print(f"{name}: starting at step {loop.start} of {args.steps}", flush=True)
    t0 = time.monotonic()

    def report(step: int, loss: float) -> None:
        done = step + 1
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)
        _fail_once(name, args, done)
        if done % args.log_every == 0 or done == args.steps:
            rate = (done - loop.start) / max(time.monotonic() - t0, 1e-9)
            print(f"{name}: step {done}/{args.steps} loss {loss:.6f} ({rate:.0f} steps/s)", flush=True)

    try:
        yield report
    except Preempted as p:
        o = p.outcome
        print(f"{name}: preempted at step {o.step}; emergency checkpoint {o.state.value} (durable={o.durable}, "
              f"reason={o.reason}); exiting {p.code}", flush=True)
        raise
    print(f"{name}: done, final step {args.steps}", flush=True)
