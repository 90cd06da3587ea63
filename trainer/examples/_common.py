"""Flags and the training-loop skeleton shared by the examples (framework-neutral)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from respawn.ckpt import PREEMPTED_EXIT_CODE, CheckpointManager


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
    return p.parse_args(argv)


def run_loop(args, mgr: CheckpointManager, start: int, train_step, get_state, log_name: str) -> int:
    """Steps start..args.steps-1; checks the notice at every step boundary. Returns the process exit code."""
    print(f"{log_name}: starting at step {start} of {args.steps}", flush=True)
    t0 = time.monotonic()
    step = start
    while step < args.steps:
        loss = train_step(step)
        step += 1
        mgr.report_step(step)
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)
        if mgr.preemption_requested:
            outcome = mgr.emergency_save(step, get_state())
            print(f"{log_name}: preempted at step {step}; emergency checkpoint {outcome['state']} "
                  f"(durable={outcome['durable']}, reason={outcome['reason']}); exiting {PREEMPTED_EXIT_CODE}",
                  flush=True)
            mgr.exit_preempted()
        if step % args.log_every == 0 or step == args.steps:
            rate = (step - start) / max(time.monotonic() - t0, 1e-9)
            print(f"{log_name}: step {step}/{args.steps} loss {loss:.6f} ({rate:.0f} steps/s)", flush=True)
        if step % args.checkpoint_every == 0 and step < args.steps:
            mgr.save(step, get_state())
    mgr.save(args.steps, get_state(), blocking=True)
    mgr.finish(args.steps)
    print(f"{log_name}: done, final step {args.steps}", flush=True)
    return 0


def exit_with(code: int) -> None:
    sys.stdout.flush()
    sys.exit(code)
