"""What respawn.ckpt.transformers costs a Hugging Face Trainer, against the Trainer's own checkpointing in the same run.
`python -m bench.framework_transformers [--steps 40] [--every 8] [--step-ms 100] [--state-mb 100] [--json]`.

Two trainings of the same GPT-2 (from a config in code, sized so that its weights and AdamW's two moments make
--state-mb of checkpoint), one process on the CPU, each step a --step-ms sleep beside the real forward/backward: the
baseline with the Trainer's own save_steps=--every (its blocking _save_checkpoint into output_dir), then the same with
resume_path(trainer) (Respawn's callback takes those saves). Timed on the training thread:
  step_ms_median               the whole step (step end to step end), baseline and Respawn, for scale
  respawn_us_between_saves     Respawn's on_step_end at a step without a save (the notice check, the status file's step)
  overhead_ratio               that / --step-ms (goal <= 0.01)
  trainer_save_ms              the Trainer's own blocking save (_save_checkpoint), median over saves
  respawn_stall_first_ms       Respawn's first periodic save on the training thread (its copy buffers allocated)
  respawn_stall_ms             Respawn's periodic save on the training thread (every rank's RNG written, the
                               scheduler and trainer state copied, the parameters' and optimizer state's copy into the
                               buffers started on a thread) plus what the next step's optimizer step waited for that
                               copy, median over the later saves; the Trainer's files are written from the copy,
                               checksummed, committed and uploaded on the save's thread
  stall_ratio                  respawn_stall_ms / trainer_save_ms (goal <= 0.10)
  emergency_save_s             the notice's save after the last step: the Trainer's checkpoint written on the training
                               thread, checksummed and committed (local disk), against
  notice_budget_s              the budget it must fit (RESPAWN_NOTICE_BUDGET_SECONDS's default)
  checkpoint_mb                the size of one committed step
In a multi-rank job the agreement's all-reduce comes on top of the per-step figure: bench.agreement measures it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def train(args: argparse.Namespace, folder: str, respawn: bool) -> dict:
    """Train --steps steps; returns the step times and the timed hooks."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from respawn.ckpt.transformers import RespawnCallback, resume_path

    width, vocab = 512, 1024
    layers = max(1, round(args.state_mb * 2**20 / 12 / (12 * width * width)))  # weights + 2 AdamW moments, float32

    class Tokens(torch.utils.data.Dataset):
        ids = torch.randint(0, vocab, (64, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    out: dict = {"ends": [], "hooks": {}, "saves": {}, "blocked": {}}

    class Step(TrainerCallback):
        def on_step_begin(self, *a, **k):
            time.sleep(args.step_ms / 1000)

        def on_step_end(self, args_, state, control, **k):
            out["ends"].append(time.perf_counter())
            if respawn and state.global_step == args.steps - 1:
                callback.manager.request_preemption("bench: the notice after the last step")

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=16, n_embd=width, n_layer=layers, n_head=8,
                                       bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(output_dir=os.path.join(folder, "output"), max_steps=args.steps,
                                 save_steps=args.every, per_device_train_batch_size=4, report_to="none",
                                 disable_tqdm=True, use_cpu=True, logging_steps=10**6)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[Step()])
    if not respawn:
        inner = trainer._save_checkpoint

        def timed_save(*a, **k):
            t0 = time.perf_counter()
            inner(*a, **k)
            out["saves"][trainer.state.global_step] = time.perf_counter() - t0

        trainer._save_checkpoint = timed_save
        trainer.train()
        return out
    from respawn.ckpt.framework_files import FilesManager

    callback = RespawnCallback(FilesManager(local_dir=os.path.join(folder, "respawn"), framework="transformers",
                                            keep=2))
    trainer.add_callback(callback)
    inner_hook, inner_emergency = callback.on_step_end, callback.manager.emergency_save

    def timed_hook(args_, state, control, **k):
        t0 = time.perf_counter()
        try:
            return inner_hook(args_, state, control, **k)
        finally:
            out["hooks"][state.global_step] = time.perf_counter() - t0
            out["blocked"][state.global_step] = callback._buffers.blocked_s  # optimizer steps' waits for copies

    def timed_emergency(step, files):
        outcome = inner_emergency(step, files)
        out["emergency"] = outcome.seconds
        out["checkpoint_mb"] = (outcome.nbytes or 0) / 2**20
        return outcome

    callback.on_step_end, callback.manager.emergency_save = timed_hook, timed_emergency
    try:
        trainer.train(resume_from_checkpoint=resume_path(trainer))
    except SystemExit:  # exit 75 after the notice's save
        pass
    callback.manager.wait()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.framework_transformers", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=8)
    p.add_argument("--step-ms", type=float, default=100.0, help="each step's sleep, beside the real compute")
    p.add_argument("--state-mb", type=float, default=100.0, help="the checkpoint's size (weights and AdamW moments)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import warnings

    warnings.filterwarnings("ignore")
    from respawn.ckpt.manager import DEFAULT_NOTICE_BUDGET_S

    saves = set(range(args.every, args.steps, args.every))
    quiet = [s for s in range(2, args.steps - 1) if s not in saves and s - 1 not in saves]  # no save's thread nearby
    with tempfile.TemporaryDirectory(prefix="respawn-bench-transformers-") as tmp:
        base = train(args, os.path.join(tmp, "base"), respawn=False)
        ours = train(args, os.path.join(tmp, "respawn"), respawn=True)

    def steps(run):
        return statistics.median(b - a for a, b in zip(run["ends"], run["ends"][1:]))

    between = statistics.median(ours["hooks"][s] for s in quiet)
    trainer_save = statistics.median(base["saves"][s] for s in saves)
    def stall_at(s):  # the hook, and the next step's optimizer step waiting for the parameters' copy
        return ours["hooks"][s] + ours["blocked"][s + 1] - ours["blocked"][s]

    first = stall_at(min(saves))  # the copy's buffers are allocated at the first save
    stall = statistics.median(stall_at(s) for s in sorted(saves)[1:]) if len(saves) > 1 else first
    result = {
        "steps": args.steps, "every": args.every, "step_ms": args.step_ms, "state_mb": args.state_mb,
        "step_ms_median": [round(steps(base) * 1e3, 1), round(steps(ours) * 1e3, 1)],
        "respawn_us_between_saves": round(between * 1e6, 1),
        "overhead_ratio": round(between / (args.step_ms / 1000), 5),
        "trainer_save_ms": round(trainer_save * 1e3, 1),
        "respawn_stall_first_ms": round(first * 1e3, 1),
        "respawn_stall_ms": round(stall * 1e3, 1),
        "stall_ratio": round(stall / trainer_save, 3),
        "emergency_save_s": ours.get("emergency"),
        "notice_budget_s": DEFAULT_NOTICE_BUDGET_S,
        "checkpoint_mb": round(ours.get("checkpoint_mb", 0), 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>26}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
