"""respawn.ckpt.transformers with the real Hugging Face Trainer: examples/workdir-hf/train.py (a 1-layer GPT-2 of
hidden size 16 built from a config in code, synthetic tokens, dropout on) run as a user runs it, under
`python -m respawn.ckpt.launch torchrun --nproc-per-node 2` (gloo on CPU), and alone without the RESPAWN_*
variables. The Trainer's own resume skips the epoch's consumed batches (HF's skip_first_batches) and restores every
rank's RNG: each step's loss after a resume is the uninterrupted run's, and so are the final weights, bit for bit.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from respawn.ckpt import PREEMPTED_EXIT_CODE
from respawn.ckpt import format as fmt
from respawn.ckpt.storage import LocalStore
import exit_threads
from trainer_helpers import free_port

# train.py's 96 samples, 4 per rank and step: 12 steps an epoch under 2 ranks. STEPS ends inside the second epoch: the
# Trainer checks max_steps only after a step, so a run resumed at max_steps inside an epoch trained step max_steps + 1
# and committed it as the final step, past the total (#45).
STEPS, SAVE = 18, 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "workdir-hf", "train.py")
DIES = os.path.join(ROOT, "tests", "hf_dies_before_vote.py")
NOTICE_AT_LAST = os.path.join(ROOT, "tests", "hf_notice_at_last_step.py")


def env() -> dict:
    out = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}  # by hand: no node agent
    out.update(PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return out


def command(ranks: int, *args: str, script: str = TRAIN) -> list[str]:
    flags = ["--steps", str(STEPS), "--save-steps", str(SAVE), "--logging-steps", "1", *args]
    if ranks == 1:
        return [sys.executable, script, *flags]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1"]
    return [sys.executable, "-m", "respawn.ckpt.launch", *torchrun, script, *flags]


def start(run, cmd: list[str], cwd) -> subprocess.Popen:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "out.log", "ab") as out:
        return subprocess.Popen(cmd, cwd=str(cwd), env=env(), stdout=out, stderr=out, start_new_session=True)


def output(run) -> str:
    return (run / "out.log").read_text(errors="replace")


def finish(proc, run, timeout=180) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{run.name} did not finish in {timeout} s:\n{output(run)[-3000:]}")


def wait_for_step(proc, run, step: int) -> None:
    wait_for_output(proc, run, lambda text: re.search(rf"train\.py(\[rank 0\])?: step {step}/{STEPS}\n", text),
                    f"step {step}")


def wait_for_output(proc, run, seen, what: str) -> None:
    deadline = time.monotonic() + 180
    while not seen(output(run)):
        if proc.poll() is not None or time.monotonic() > deadline:
            finish(proc, run, timeout=1)
            pytest.fail(f"{run.name} never reached {what}:\n{output(run)[-3000:]}")
        time.sleep(0.05)


def losses(text: str) -> dict[int, str]:
    return {int(s): v for s, v in re.findall(r"train\.py(?:\[rank 0\])?: loss at step (\d+): (\S+)", text)}


def committed(ckpt) -> list[int]:
    return sorted(s for s, done in LocalStore(str(ckpt)).steps().items() if done)


def assert_same_weights(path, reference) -> None:
    got, want = torch.load(path), torch.load(reference)
    assert got.keys() == want.keys()
    different = [k for k in want if not torch.equal(got[k], want[k])]
    assert not different, f"weights differ from the uninterrupted run's: {different}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 2-rank run from start to end: its final weights and every step's loss. It commits its periodic steps and
    the last, STEPS, and trains no step past it; its ranks leave no group of Respawn's at exit."""
    run = tmp_path_factory.mktemp("uninterrupted")
    proc = start(run, exit_threads.under(command(2, "--weights-out", str(run / "weights.pt")), TRAIN), run)
    assert finish(proc, run) == 0, output(run)[-3000:]
    text = output(run)
    ckpt = run / "respawn-checkpoints"
    assert committed(ckpt) == [SAVE, 2 * SAVE, STEPS] and max(LocalStore(str(ckpt)).steps()) == STEPS, text[-3000:]
    assert not re.search(rf"train\.py\[rank \d\]: step {STEPS + 1}/", text), text[-3000:]
    exit_threads.assert_only_the_default_group(text)
    return run / "weights.pt", losses(text)


def test_a_rank_killed_before_its_vote_then_a_sigterm_resume_bit_identical_with_every_rank_at_one_step(
        tmp_path, uninterrupted):
    weights, reference = uninterrupted
    ckpt = tmp_path / "respawn-checkpoints"
    # Rank 1 dies when it would vote on the periodic step 2*SAVE, after both ranks wrote its files: no marker, and
    # SAVE (written from the in-memory copy on the save's thread) stays the newest committed step.
    run = tmp_path / "dies"
    proc = start(run, dies_command(1, 2 * SAVE), tmp_path)
    assert finish(proc, run) != 0, output(run)[-3000:]
    assert committed(ckpt) == [SAVE], output(run)[-3000:]
    assert not os.path.exists(os.path.join(LocalStore(str(ckpt)).step_dir(2 * SAVE), fmt.MARKER))

    # One notice at a random step, sent to the launcher's own pid (`kill PID`): the run resumed from the periodic
    # step stops at one agreed step; the last run resumes from that emergency step and saves periodic steps after it.
    held, seen = SAVE, {}
    at = random.randint(held + 2, STEPS - 3)
    run = tmp_path / "notice"
    proc = start(run, command(2, "--step-seconds", "0.3"), tmp_path)
    wait_for_step(proc, run, at)
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc, run) == PREEMPTED_EXIT_CODE, output(run)[-3000:]
    text = output(run)
    for rank in (0, 1):
        assert re.search(rf"train\.py\[rank {rank}\]: starting at step {held} of {STEPS}\n", text), text[-3000:]
    stopped = {int(rank): int(step) for step, rank in re.findall(
        r'"message": "preempted at step (\d+); emergency checkpoint committed".*?"rank": (\d+)', text)}
    assert sorted(stopped) == [0, 1] and len(set(stopped.values())) == 1, text[-3000:]  # one agreed step
    step = stopped[0]
    assert at <= step < STEPS and committed(ckpt)[-1] == step, (at, step, committed(ckpt))
    manifest = fmt.read_manifest(LocalStore(str(ckpt)).step_dir(step))
    assert manifest["kind"] == "emergency" and manifest["framework"] == "transformers" and manifest["members"] == 2
    assert {f"checkpoint-{step}/rng_state_0.pth", f"checkpoint-{step}/rng_state_1.pth",
            f"checkpoint-{step}/trainer_state.json", f"checkpoint-{step}/optimizer.pt",
            f"checkpoint-{step}/model.safetensors"} <= set(manifest["files"])
    seen.update(losses(text))

    # A second notice inside the last step, STEPS (tests/hf_notice_at_last_step.py holds that step on every rank until
    # its notice has come): the emergency step is STEPS itself.
    held = step
    run = tmp_path / "last"
    proc = start(run, command(2, script=NOTICE_AT_LAST), tmp_path)
    wait_for_output(proc, run, lambda text: all(f"train.py[rank {r}]: waiting for the notice at step {STEPS}\n" in text
                                                for r in (0, 1)), f"the last step, {STEPS}, on both ranks")
    os.kill(proc.pid, signal.SIGTERM)  # `kill PID` of the launcher: the notice for every rank
    assert finish(proc, run) == PREEMPTED_EXIT_CODE, output(run)[-3000:]
    text = output(run)
    assert re.search(rf"train\.py\[rank 1\]: starting at step {held} of {STEPS}\n", text), text[-3000:]
    stopped = {int(rank): int(step) for step, rank in re.findall(
        r'"message": "preempted at step (\d+); emergency checkpoint committed".*?"rank": (\d+)', text)}
    assert stopped == {0: STEPS, 1: STEPS}, text[-3000:]
    assert committed(ckpt)[-1] == STEPS and max(LocalStore(str(ckpt)).steps()) == STEPS, committed(ckpt)
    assert fmt.read_manifest(LocalStore(str(ckpt)).step_dir(STEPS))["kind"] == "emergency"
    seen.update(losses(text))

    # The restart at max_steps restores STEPS and trains nothing (the "already complete" check: without it the
    # Trainer, resumed inside an epoch, trained step STEPS + 1), and leaves no group of Respawn's at its exit.
    run = tmp_path / "again"
    proc = start(run, exit_threads.under(command(2, "--weights-out", str(tmp_path / "weights.pt")), TRAIN), tmp_path)
    assert finish(proc, run) == 0, output(run)[-3000:]
    text = output(run)
    assert re.search(rf"train\.py\[rank 1\]: starting at step {STEPS} of {STEPS}\n", text), text[-3000:]
    assert f"the run is already complete at step {STEPS}" in text and f"train.py: done at step {STEPS}" in text
    assert not re.search(rf"train\.py\[rank \d\]: step {STEPS + 1}/", text), text[-3000:]
    assert committed(ckpt)[-1] == STEPS and max(LocalStore(str(ckpt)).steps()) == STEPS, committed(ckpt)
    exit_threads.assert_only_the_default_group(text)
    # Each step after a resume trained on the uninterrupted run's batches (HF skips the epoch's consumed ones): its
    # loss (the mean of both ranks') is the same number, and so are the final weights.
    assert len(seen) >= STEPS - SAVE - 2, seen
    assert seen == {s: v for s, v in reference.items() if s in seen}, (seen, reference)
    assert_same_weights(tmp_path / "weights.pt", weights)


def dies_command(rank: int, step: int) -> list[str]:
    cmd = command(2, script=DIES)
    at = cmd.index(DIES)
    return cmd[:at + 1] + [str(rank), str(step)] + cmd[at + 1:]


def test_alone_without_a_node_it_saves_on_sigterm_locally_and_the_plain_trainer_resumes_it(tmp_path):
    run = tmp_path / "alone"
    proc = start(run, command(1, "--step-seconds", "0.2"), tmp_path)
    at = random.randint(2, SAVE - 2)
    wait_for_step(proc, run, at)
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc, run) == PREEMPTED_EXIT_CODE, output(run)[-3000:]
    text = output(run)
    ckpt = tmp_path / "respawn-checkpoints"
    assert '"message": "checkpoints", ' in text and str(ckpt) in text  # the folder in use, said at start
    step = committed(ckpt)[-1]
    assert at <= step < SAVE and fmt.read_manifest(LocalStore(str(ckpt)).step_dir(step))["kind"] == "emergency"

    # The committed folder is a plain Trainer checkpoint: Trainer.train(resume_from_checkpoint=...) with no Respawn.
    # By its path, under a name of its own: another test's `train` module may already be in sys.modules.
    spec = importlib.util.spec_from_file_location("respawn_hf_example_train", TRAIN)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    folder = os.path.join(LocalStore(str(ckpt)).step_dir(step), f"checkpoint-{step}")
    saved = load_file(os.path.join(folder, "model.safetensors"))
    loaded = {}

    class Loaded(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            loaded["step"] = state.global_step
            loaded["weights"] = {k: v.clone() for k, v in model.state_dict().items()}

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    trainer = Trainer(model=GPT2LMHeadModel(config), train_dataset=example.Tokens(96, 16, 64), callbacks=[Loaded()],
                      args=TrainingArguments(output_dir=str(tmp_path / "plain"), max_steps=step + 1, save_strategy="no",
                                             per_device_train_batch_size=4, report_to="none", use_cpu=True,
                                             disable_tqdm=True, seed=7))
    trainer.train(resume_from_checkpoint=folder)
    assert loaded["step"] == step and trainer.state.global_step == step + 1
    assert all(torch.equal(loaded["weights"][k], v) for k, v in saved.items())
