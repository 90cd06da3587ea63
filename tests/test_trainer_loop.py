"""TrainingLoop: restore in place and resume at the right step, periodic asynchronous saves, the emergency save and
exit 75 on a notice (in-process and a real SIGTERM to a subprocess), the SIGTERM handler only inside the loop, the
final save, torch objects restored in place and a JAX pytree restored by value."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from respawn import contract
from respawn.ckpt import CheckpointManager, Preempted, SaveOutcome, SaveState, TrainingLoop, read_status
from respawn.ckpt import format as fmt
from respawn.ckpt.storage import LocalStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def manager(tmp_path, **kw) -> CheckpointManager:
    kw.setdefault("keep", 100)
    return CheckpointManager(local_dir=str(tmp_path / "ckpt"), status_file=str(tmp_path / "status.json"), **kw)


def committed_steps(tmp_path) -> list[int]:
    return sorted(s for s, c in LocalStore(str(tmp_path / "ckpt")).steps().items() if c)


def fresh_data() -> dict:
    return {"n": 0, "x": np.zeros(4)}


def body(data: dict) -> None:
    data["n"] += 1
    data["x"] += data["n"]


@pytest.fixture
def sigterm_restored():
    """Tests install handlers in pytest's own process: put the original one back afterwards."""
    original = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, original)


def test_fresh_run_saves_periodically_async_then_final(tmp_path):
    data = fresh_data()
    seen, collected = [], {}
    with TrainingLoop(10, every=3, manager=manager(tmp_path), data=data) as loop:
        assert loop.start == 0
        for step in loop:
            seen.append(step)
            if step in (3, 6):
                # The save of `step` was started after the previous body and is collected only now: the loop did
                # not wait for it.
                collected[step] = loop.manager.wait()
            body(data)
    assert seen == list(range(10)) and loop.step == 10
    for step, outcome in collected.items():
        assert outcome.committed and outcome.step == step and outcome.durable == "remote", outcome
    assert isinstance(loop.final, SaveOutcome) and loop.final.committed and loop.final.step == 10
    assert committed_steps(tmp_path) == [3, 6, 9, 10]
    status = read_status(str(tmp_path / "status.json"))
    assert status["step"] == 10 and status["committed_step"] == 10 and status["total_steps"] == 10
    assert status["committed_kind"] == "periodic" and status["emergency"]["state"] == "idle"
    step, ckpt = manager(tmp_path).restore()
    assert step == 10 and ckpt["data"]["n"] == 10 and set(ckpt) == {"data", "rng"}


def test_notice_mid_run_emergency_save_then_resume_in_place(tmp_path):
    data = fresh_data()
    with pytest.raises(Preempted) as exc:
        with TrainingLoop(10, every=3, manager=manager(tmp_path), data=data) as loop:
            for step in loop:
                body(data)
                if step == 4:  # the notice arrives during step 4; the loop acts on it once the step is done
                    loop.manager.request_preemption("test")
    assert exc.value.code == contract.EXIT_PREEMPTED
    outcome = exc.value.outcome
    assert outcome.state == SaveState.COMMITTED and outcome.step == 5 and outcome.durable == "remote"
    status = read_status(str(tmp_path / "status.json"))
    assert status["emergency"] == {"state": "committed", "step": 5, "reason": None}
    assert status["committed_step"] == 5 and status["committed_kind"] == "emergency"
    assert max(committed_steps(tmp_path)) == 5  # (3 too, unless its save was still running: then it was cancelled)

    again = fresh_data()
    with TrainingLoop(10, every=3, manager=manager(tmp_path), data=again) as loop:
        assert loop.start == 5 and again["n"] == 5, "the data position must be restored in place on entry"
        steps = []
        for step in loop:
            steps.append(step)
            body(again)
    assert steps == [5, 6, 7, 8, 9]
    uninterrupted = fresh_data()
    for _ in range(10):
        body(uninterrupted)
    assert again["n"] == 10 and np.array_equal(again["x"], uninterrupted["x"])
    assert read_status(str(tmp_path / "status.json"))["committed_step"] == 10


def test_notice_during_the_last_step_then_nothing_left_to_run(tmp_path):
    data = fresh_data()
    with pytest.raises(Preempted) as exc:
        with TrainingLoop(4, every=2, manager=manager(tmp_path), data=data) as loop:
            for step in loop:
                body(data)
                if step == 3:
                    loop.manager.request_preemption("test")
    assert exc.value.outcome.step == 4 and exc.value.outcome.committed
    with TrainingLoop(4, every=2, manager=manager(tmp_path), data=fresh_data()) as loop:
        assert list(loop) == []
    assert loop.final.committed and loop.final.step == 4
    assert read_status(str(tmp_path / "status.json"))["committed_step"] == 4


def test_signal_handler_only_inside_the_loop(tmp_path, sigterm_restored):
    got = []

    def previous(signum, frame):
        got.append(signum)

    signal.signal(signal.SIGTERM, previous)
    m = manager(tmp_path)  # the constructor installs nothing by default
    assert signal.getsignal(signal.SIGTERM) is previous
    with TrainingLoop(3, every=0, manager=m, data=fresh_data()) as loop:
        assert signal.getsignal(signal.SIGTERM) == m._notice.on_signal
        for _ in loop:
            assert signal.getsignal(signal.SIGTERM) == m._notice.on_signal
    assert signal.getsignal(signal.SIGTERM) is previous
    os.kill(os.getpid(), signal.SIGTERM)  # after the loop: the previous handler gets it
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [signal.SIGTERM] and not m.preemption_requested

    # Without `with`, the iteration is the scope.
    m2 = manager(tmp_path / "b")
    for _ in TrainingLoop(2, every=0, manager=m2, data=fresh_data()):
        assert signal.getsignal(signal.SIGTERM) == m2._notice.on_signal
    assert signal.getsignal(signal.SIGTERM) is previous


def test_the_handler_is_put_back_when_the_loop_is_left_by_the_notice(tmp_path, sigterm_restored):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with pytest.raises(Preempted):
        with TrainingLoop(5, every=0, manager=manager(tmp_path), data=fresh_data()) as loop:
            for _ in loop:
                os.kill(os.getpid(), signal.SIGTERM)  # delivered to the loop's handler: a notice, not death
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert read_status(str(tmp_path / "status.json"))["emergency"]["step"] == 1


def test_outside_the_main_thread_no_handler_but_request_preemption_works(tmp_path, capfd):
    before = signal.getsignal(signal.SIGTERM)
    result = {}

    def run():
        try:
            with TrainingLoop(5, every=0, manager=manager(tmp_path), data=fresh_data()) as loop:
                for step in loop:
                    result.setdefault("handler", signal.getsignal(signal.SIGTERM))
                    if step == 1:
                        loop.manager.request_preemption("the trainer's own watcher")
        except Preempted as p:
            result["outcome"] = p.outcome

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert result["handler"] is before and signal.getsignal(signal.SIGTERM) is before
    assert result["outcome"].committed and result["outcome"].step == 2
    assert "not in the main thread" in capfd.readouterr().err


CHILD = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from respawn.ckpt import CheckpointManager, TrainingLoop

    mode, total, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mgr = CheckpointManager(local_dir=os.path.join(root, "ckpt"), status_file=os.path.join(root, "status.json"))
    data = {"n": 0, "x": np.zeros(8)}
    with TrainingLoop(total, every=5, manager=mgr, data=data) as loop:
        print("start", loop.start, flush=True)
        for step in loop:
            data["n"] += 1
            data["x"] += 1.0
            time.sleep(0.02)
    print("done", data["n"], flush=True)
    if mode == "sigterm-after":
        os.kill(os.getpid(), signal.SIGTERM)  # outside the loop: the default action again
        time.sleep(30)
""")


def run_child(tmp_path, mode, total, **popen):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, str(script), mode, str(total), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_real_sigterm_to_a_process_exits_75_then_resumes(tmp_path):
    child = run_child(tmp_path, "run", 100000)
    deadline = time.monotonic() + 60
    while (st := read_status(str(tmp_path / "status.json"))) is None or st["step"] < 12:
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == contract.EXIT_PREEMPTED, err[-3000:]
    st = read_status(str(tmp_path / "status.json"))
    saved = st["emergency"]["step"]
    assert st["emergency"]["state"] == "committed" and st["committed_step"] == saved >= 12
    assert st["committed_kind"] == "emergency" and "done" not in out
    assert (tmp_path / "ckpt" / fmt.step_dirname(saved) / fmt.MARKER).exists()

    child = run_child(tmp_path, "sigterm-after", saved + 7)
    out, err = child.communicate(timeout=60)
    # Resumed at the emergency step, finished (final save committed), then SIGTERM outside the loop kills it.
    assert f"start {saved}\n" in out and f"done {saved + 7}\n" in out, (out, err[-3000:])
    assert child.returncode == -signal.SIGTERM, err[-3000:]
    st = read_status(str(tmp_path / "status.json"))
    assert st["step"] == st["committed_step"] == saved + 7


def test_final_save_not_committed_raises(tmp_path, monkeypatch):
    real = fmt.write_checkpoint

    def failing(root, step, kind, payload, **kw):
        if step == 4:
            raise OSError(28, "No space left on device")
        return real(root, step, kind, payload, **kw)

    monkeypatch.setattr(fmt, "write_checkpoint", failing)
    with pytest.raises(RuntimeError, match="final checkpoint .step 4. was not committed: failed"):
        with TrainingLoop(4, every=2, manager=manager(tmp_path), data=fresh_data()) as loop:
            for _ in loop:
                pass
    assert loop.final.state == SaveState.FAILED and "No space left" in loop.final.reason
    assert committed_steps(tmp_path) == [2]


def test_restore_needs_every_name_in_the_checkpoint(tmp_path):
    with TrainingLoop(2, every=0, manager=manager(tmp_path), data=fresh_data()) as loop:
        list(loop)
    with pytest.raises(SystemExit, match=r"no \['position'\]"):  # loop.CheckpointError: one line
        with TrainingLoop(4, every=0, manager=manager(tmp_path), position=fresh_data()):
            pass
    with pytest.raises(TypeError, match="cannot restore model=int in place"):
        TrainingLoop(4, every=0, manager=manager(tmp_path), model=3)


class Counter:
    """A DCP-style Stateful object."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def test_torch_objects_restored_in_place_and_resume_bit_exact(tmp_path):
    torch = pytest.importorskip("torch")

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"model": model, "optimizer": opt, "scheduler": sched, "counter": Counter(),
                "batches": torch.Generator().manual_seed(1), "noise": np.random.default_rng(2)}

    def train(objs, loop, stop_at=None):
        for step in loop:
            xb = torch.randn(4, 6, generator=objs["batches"])
            yb = torch.as_tensor(objs["noise"].standard_normal((4, 1)), dtype=torch.float32)
            loss = torch.nn.functional.mse_loss(objs["model"](xb), yb)  # dropout: the global torch RNG
            objs["optimizer"].zero_grad()
            loss.backward()
            objs["optimizer"].step()
            objs["scheduler"].step()
            objs["counter"].seen += 1
            if step == stop_at:
                loop.manager.request_preemption("test")

    ref = build()
    with TrainingLoop(9, every=4, manager=manager(tmp_path / "ref"), **ref) as loop:
        train(ref, loop)

    first = build()
    with pytest.raises(Preempted):
        with TrainingLoop(9, every=4, manager=manager(tmp_path / "run"), **first) as loop:
            train(first, loop, stop_at=5)
    second = build()
    ids = {k: id(v) for k, v in second.items()}
    with TrainingLoop(9, every=4, manager=manager(tmp_path / "run"), **second) as loop:
        assert loop.start == 6 and second["counter"].seen == 6
        assert second["scheduler"].last_epoch == 6 and second["optimizer"].param_groups[0]["lr"] == 1e-2 * 0.25
        for (k, a), (_, b) in zip(first["model"].state_dict().items(), second["model"].state_dict().items()):
            assert torch.equal(a, b), k
        train(second, loop)
    assert {k: id(v) for k, v in second.items()} == ids, "objects are restored in place, not replaced"
    assert second["counter"].seen == 9
    for (k, a), (_, b) in zip(ref["model"].state_dict().items(), second["model"].state_dict().items()):
        assert torch.equal(a, b), f"{k} differs after preempt + resume"
    assert torch.equal(ref["batches"].get_state(), second["batches"].get_state())


def test_the_restore_reads_into_the_models_own_parameters(tmp_path):
    """TrainingLoop hands its objects' state_dict()s to the restore (like=): the saved bytes land in the parameters
    themselves, so a restore holds no second copy of the model in memory."""
    torch = pytest.importorskip("torch")
    restored = []

    class Recording(CheckpointManager):
        def restore(self, step=None, like=None):
            got = super().restore(step, like)
            restored.append(got)
            return got

    def build():
        torch.manual_seed(0)
        return torch.nn.Linear(64, 32)

    first = build()
    with pytest.raises(Preempted):
        with TrainingLoop(4, every=2, manager=manager(tmp_path), model=first) as loop:
            for step in loop:
                first.weight.data.add_(step)
                if step == 2:
                    loop.manager.request_preemption("test")
    second = build()
    with TrainingLoop(4, every=2, manager=Recording(local_dir=str(tmp_path / "ckpt")), model=second) as loop:
        assert loop.start == 3
        state = restored[0][1]["model"]
        assert state["weight"].data_ptr() == second.weight.data_ptr()
        assert state["bias"].data_ptr() == second.bias.data_ptr()
        assert torch.equal(second.weight, first.weight)


def test_jax_pytree_restored_by_value(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    def initial():
        return {"w": jnp.zeros(3), "opt": (jnp.array(0, jnp.int32),), "key": jax.random.key(0)}

    def update(state):
        key, sub = jax.random.split(state["key"])
        return {"w": state["w"] + jax.random.normal(sub, (3,)), "opt": (state["opt"][0] + 1,), "key": key}

    ref = TrainingLoop(6, every=2, manager=manager(tmp_path / "ref"), state=initial())
    with ref:
        for _ in ref:
            ref.state = update(ref.state)

    with pytest.raises(Preempted):
        with TrainingLoop(6, every=2, manager=manager(tmp_path / "run"), state=initial()) as loop:
            for step in loop:
                loop.state = update(loop.state)
                if step == 2:
                    loop.manager.request_preemption("test")
    with TrainingLoop(6, every=2, manager=manager(tmp_path / "run"), state=initial()) as loop:
        assert loop.start == 3 and int(loop.state["opt"][0]) == 3
        assert isinstance(loop.state["opt"], tuple) and isinstance(loop.state["w"], jax.Array)
        assert jax.dtypes.issubdtype(loop.state["key"].dtype, jax.dtypes.prng_key)
        for _ in loop:
            loop.state = update(loop.state)
    assert np.asarray(loop.state["w"]).tobytes() == np.asarray(ref.state["w"]).tobytes()
    assert np.array_equal(jax.random.key_data(loop.state["key"]), jax.random.key_data(ref.state["key"]))
