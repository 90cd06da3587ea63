"""A Hugging Face Trainer job under Respawn: a tiny GPT-2 built from a config in code, trained on synthetic token
data (nothing downloaded). The two Respawn lines are marked; the rest is a plain Trainer script.

    python train.py --steps 200                                           # one process
    python -m respawn.ckpt.launch torchrun --nproc-per-node 2 train.py    # DDP, 2 ranks (gloo on CPU)

On the notice (SIGTERM) every rank stops after one agreed step, the Trainer's checkpoint of that step is committed
and the process exits 75; the next start resumes there.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config in code, synthetic data: the Hub is never asked
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from respawn.ckpt.transformers import resume_path  # noqa: E402  (Respawn, line 1 of 2)


class Tokens(torch.utils.data.Dataset):
    """`size` sequences of `length` random token ids (a fixed seed): labels are the inputs (causal LM)."""

    def __init__(self, size: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (size, length), generator=torch.Generator().manual_seed(1234))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def say(line: str) -> None:
    """One line in one write: the ranks share the output, and torchrun leaves it unbuffered."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Progress(TrainerCallback):
    """One line per step (what the demo and the tests read), and a pause that stands for a bigger model's step."""

    def __init__(self, rank: int, seconds: float) -> None:
        self.name = "train.py" if int(os.environ.get("WORLD_SIZE", "1")) == 1 else f"train.py[rank {rank}]"
        self.seconds = seconds

    def on_train_begin(self, args, state, control, **kwargs):
        say(f"{self.name}: starting at step {state.global_step} of {state.max_steps}")

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds:
            time.sleep(self.seconds)
        say(f"{self.name}: step {state.global_step}/{state.max_steps}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and state.is_world_process_zero:  # the mean over the ranks, the same on each
            say(f"{self.name}: loss at step {state.global_step}: {logs['loss']!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--output-dir", default="hf-output")
    parser.add_argument("--weights-out", help="write the final weights here (torch.save of the state_dict)")
    args = parser.parse_args(argv)

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, save_steps=args.save_steps, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=args.logging_steps, report_to="none", disable_tqdm=True, use_cpu=True, seed=7,
        dataloader_num_workers=2)  # loader worker processes, as most jobs read: the notice never reaches them
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(96, 16, config.vocab_size),
                      callbacks=[Progress(training.process_index, args.step_seconds)])
    trainer.train(resume_from_checkpoint=resume_path(trainer))  # Respawn, line 2 of 2
    if args.weights_out and training.process_index == 0:
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, args.weights_out)
    say(f"train.py: done at step {trainer.state.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
