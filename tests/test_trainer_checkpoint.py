"""Checkpoint format, restore fallback past corrupt checkpoints, the deadline path, retention, the status file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from respawn.ckpt import CheckpointManager, PREEMPTED_EXIT_CODE, SaveOutcome, SaveState, plan_retention, read_status
from respawn.ckpt import format as fmt
from respawn.ckpt.serialize import flatten


def make_state(seed: int, mb: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(int(mb * (1 << 20)) // 8), "b": rng.standard_normal((3, 4)).astype(np.float32),
            "step_info": {"seed": seed, "tuple": (1, "x")}, "empty": np.zeros((0, 2))}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert a[k].tobytes() == b[k].tobytes(), f"array {k} differs after restore"
        else:
            assert a[k] == b[k], k


def manager(tmp_path, **kw) -> CheckpointManager:
    kw.setdefault("shard_bytes", 256 << 10)  # several data files even for small states
    return CheckpointManager(local_dir=str(tmp_path / "ckpt"), status_file=str(tmp_path / "status.json"), **kw)


def step_dir(tmp_path, step):
    return tmp_path / "ckpt" / fmt.step_dirname(step)


def test_layout_manifest_and_roundtrip(tmp_path):
    m = manager(tmp_path)
    state = make_state(1)
    m.save(7, state, blocking=True)
    d = step_dir(tmp_path, 7)
    names = sorted(os.listdir(d))
    assert names[-1] == "tree.pkl" and fmt.MARKER in names and fmt.MANIFEST in names
    assert sum(n.startswith("data-") for n in names) >= 2
    manifest = json.loads((d / fmt.MANIFEST).read_text())
    assert manifest["step"] == 7 and manifest["kind"] == "periodic" and manifest["framework"] == "numpy"
    assert set(manifest["files"]) == {n for n in names if n not in (fmt.MARKER, fmt.MANIFEST)}
    assert all({"size", "checksum"} <= set(f) for f in manifest["files"].values())
    assert isinstance(manifest["created_at"], float)
    step, restored = manager(tmp_path).restore()
    assert step == 7
    assert_same(state, restored)


def test_periodic_snapshot_is_isolated_from_later_mutation(tmp_path):
    m = manager(tmp_path)
    state = make_state(2)
    expected = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in state.items()}
    m.save(1, state)
    state["w"][:] = -1.0  # the training loop goes on mutating in place while the save runs
    m.wait()
    assert_same(expected, manager(tmp_path).restore()[1])


def corrupt_truncate(d):
    f = d / "data-00000.bin"
    f.write_bytes(f.read_bytes()[:-100])


def corrupt_marker(d):
    (d / fmt.MARKER).unlink()


def corrupt_checksum(d):
    f = d / "data-00001.bin"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def corrupt_manifest(d):
    m = json.loads((d / fmt.MANIFEST).read_text())
    m["step"] = 999
    (d / fmt.MANIFEST).write_text(json.dumps(m))


def corrupt_missing_file(d):
    (d / "tree.pkl").unlink()


@pytest.mark.parametrize("corrupt", [corrupt_truncate, corrupt_marker, corrupt_checksum, corrupt_manifest,
                                     corrupt_missing_file])
def test_restore_falls_back_past_corrupt_newest(tmp_path, corrupt, capfd):
    m = manager(tmp_path)
    states = {s: make_state(s) for s in (10, 20, 30)}
    for s, st in states.items():
        m.save(s, st, blocking=True)
    corrupt(step_dir(tmp_path, 30))
    capfd.readouterr()
    step, restored = manager(tmp_path).restore()
    assert step == 20, f"{corrupt.__name__}: expected fallback to step 20, got {step}"
    assert_same(states[20], restored)
    logs = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    fallback = [e for e in logs if e["severity"] == "WARNING" and e.get("step") == 30]
    assert fallback and "falling back" in fallback[0]["message"], logs


def test_fallback_over_two_corrupt_steps(tmp_path):
    m = manager(tmp_path)
    for s in (1, 2, 3):
        m.save(s, make_state(s), blocking=True)
    corrupt_checksum(step_dir(tmp_path, 3))
    corrupt_truncate(step_dir(tmp_path, 2))
    step, restored = manager(tmp_path).restore()
    assert step == 1
    assert_same(make_state(1), restored)


def test_nothing_committed_means_fresh_start(tmp_path):
    m = manager(tmp_path)
    assert m.restore() is None
    m.save(1, make_state(1), blocking=True)
    corrupt_marker(step_dir(tmp_path, 1))
    assert manager(tmp_path).restore() is None


def test_emergency_deadline_already_passed_is_abandoned_cleanly(tmp_path):
    m = manager(tmp_path, notice_budget_s=5)
    m.save(10, make_state(10), blocking=True)
    m.request_preemption("test", notice_at=time.monotonic() - 60)  # the budget ran out before the step boundary
    assert m.preemption_requested
    outcome = m.emergency_save(11, make_state(11))
    assert outcome.state == SaveState.ABANDONED and outcome.step == 11 and "deadline" in outcome.reason
    assert not outcome.committed and outcome.durable is None
    assert not step_dir(tmp_path, 11).exists(), "an abandoned save must not leave its directory behind"
    status = read_status(str(tmp_path / "status.json"))
    assert status["emergency"] == {"state": "abandoned", "step": 11, "reason": outcome.reason}
    assert status["committed_step"] == 10
    step, restored = manager(tmp_path).restore()
    assert step == 10
    assert_same(make_state(10), restored)


def test_write_stopped_mid_file_leaves_previous_checkpoint_intact(tmp_path):
    m = manager(tmp_path)
    m.save(1, make_state(1), blocking=True)
    stop = threading.Event()
    seen = []

    def progress(written):
        seen.append(written)
        stop.set()  # the deadline "passes" right after the first chunk hits the disk

    control = fmt.WriteControl(cancel=stop, progress=progress)
    with pytest.raises(fmt.Abandoned):
        fmt.write_checkpoint(str(tmp_path / "ckpt"), 2, "emergency", flatten(make_state(2, mb=20), copy=False),
                             control=control)
    assert seen, "the write should have started"
    assert not step_dir(tmp_path, 2).exists()
    step, restored = manager(tmp_path).restore()
    assert step == 1
    assert_same(make_state(1), restored)


def test_emergency_save_commits_and_reports(tmp_path):
    m = manager(tmp_path, notice_budget_s=30)
    m.save(4, make_state(4), blocking=True)
    m.request_preemption("agent")
    outcome = m.emergency_save(6, make_state(6))
    assert outcome == SaveOutcome(SaveState.COMMITTED, 6, "remote", None, outcome.seconds, outcome.nbytes)
    assert outcome.seconds > 0
    status = read_status(str(tmp_path / "status.json"))
    assert status["committed_step"] == 6 and status["committed_kind"] == "emergency"
    assert status["emergency"]["state"] == "committed" and status["emergency"]["step"] == 6
    manifest = json.loads((step_dir(tmp_path, 6) / fmt.MANIFEST).read_text())
    assert manifest["kind"] == "emergency" and manifest["total_bytes"] == outcome.nbytes
    assert manager(tmp_path).restore()[0] == 6


def test_emergency_at_already_committed_step_reuses_it(tmp_path):
    m = manager(tmp_path)
    m.save(5, make_state(5), blocking=True)
    outcome = m.emergency_save(5, make_state(5))
    assert outcome.committed and outcome.step == 5 and outcome.nbytes is None  # nothing written again


def test_plan_retention():
    steps = {1: True, 2: True, 3: True, 4: True, 5: True, 6: False, 7: False}
    kinds = {1: "periodic", 2: "emergency", 3: "periodic", 4: "periodic", 5: "periodic"}
    # newest 2 committed (5, 4) + newest emergency (2); uncommitted 6 removed, in-flight 7 protected
    assert plan_retention(steps, kinds, keep=2, protect={7}) == [1, 3, 6]


def test_retention_keeps_newest_and_emergency_and_removes_leftovers(tmp_path):
    m = manager(tmp_path, keep=2)
    m.save(1, make_state(1, 0.1), blocking=True)
    m.emergency_save(2, make_state(2, 0.1))
    leftover = step_dir(tmp_path, 3)
    leftover.mkdir()
    (leftover / "data-00000.bin").write_bytes(b"torn")
    for s in (4, 5, 6):
        m.save(s, make_state(s, 0.1), blocking=True)
    present = sorted(os.listdir(tmp_path / "ckpt"))
    assert present == [fmt.step_dirname(s) for s in (2, 5, 6)], present


def test_status_file_and_read_status(tmp_path):
    path = str(tmp_path / "status.json")
    assert read_status(path) is None  # missing
    m = manager(tmp_path, total_steps=100)
    m.report_step(1)
    st = read_status(path)
    assert set(st) == {"step", "committed_step", "committed_kind", "committed_durable", "emergency", "total_steps",
                       "updated_at", "pid", "rejoin", "generation", "first_step", "first_step_at"}
    assert st["total_steps"] == 100 and st["pid"] == os.getpid() and st["emergency"]["state"] == "idle"
    m.save(3, make_state(3, 0.1), blocking=True)
    assert read_status(path)["committed_step"] == 3
    (tmp_path / "half.json").write_text('{"step": 4, "committ')
    assert read_status(str(tmp_path / "half.json")) is None  # half-written
    (tmp_path / "empty.json").write_text("")
    assert read_status(str(tmp_path / "empty.json")) is None


def test_the_first_step_past_the_restore_is_recorded_at_once_with_its_time(tmp_path):
    # The agent may read the status file only after the resumed run ended (a short run between two beats): the
    # trainer's own record of its first step is what ends its recovery (respawn.control.recovery_time).
    path = str(tmp_path / "status.json")
    manager(tmp_path).save(60, make_state(1), blocking=True)
    m = manager(tmp_path, total_steps=100)
    step, _ = m.restore()
    m.report_step(step)  # an integration reports its restored step: no step trained
    assert read_status(path)["first_step"] is None
    before = time.time()
    m.report_step(61)
    m.report_step(62)
    st = read_status(path)  # written at once, although step reports are rate-limited
    assert st["first_step"] == 61 and before <= st["first_step_at"] <= time.time()


def test_import_trainer_without_torch_or_jax():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['jax'] = None\n"
            "import respawn.ckpt, respawn.ckpt.examples._common\n"
            "import numpy as np, tempfile\n"
            "m = respawn.ckpt.CheckpointManager(local_dir=tempfile.mkdtemp())\n"
            "assert m.save(1, {'a': np.arange(3)}, blocking=True).committed and m.restore()[0] == 1\n"
            "print(respawn.ckpt.PREEMPTED_EXIT_CODE)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"importing trainer must not need torch or jax:\n{out.stderr}"
    assert out.stdout.strip() == str(PREEMPTED_EXIT_CODE)


def test_torch_state_roundtrip_bit_exact(tmp_path):
    torch = pytest.importorskip("torch")
    from respawn.ckpt.torch_state import load_torch_state, torch_state

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step(), sched.step()
    extra = {"bf16": torch.randn(5).to(torch.bfloat16), "scalar": torch.tensor(3), "int": 7}
    m = manager(tmp_path)
    m.save(3, torch_state(model, opt, sched, data={"pos": 12}, extra=extra), blocking=True)
    expected_next = torch.rand(3)  # what the RNG produces right after the checkpoint

    model2 = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt2, 10)
    step, state = manager(tmp_path).restore()
    load_torch_state(state, model2, opt2, sched2)
    assert step == 3 and state["data"] == {"pos": 12}
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), k
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt2.state_dict()["state"][0]["exp_avg"])
    assert sched2.state_dict() == sched.state_dict()
    assert torch.equal(state["extra"]["bf16"], extra["bf16"]) and state["extra"]["bf16"].dtype == torch.bfloat16
    assert torch.equal(torch.rand(3), expected_next), "torch RNG state not restored"


def test_jax_state_roundtrip_bit_exact(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from respawn.ckpt.jax_state import to_template

    state = {"params": [{"w": jax.random.normal(jax.random.PRNGKey(0), (4, 3)), "b": jnp.zeros(3, jnp.bfloat16)}],
             "opt": {"t": jnp.array(5, jnp.int32)}, "key": jax.random.key(7), "raw_key": jax.random.PRNGKey(3),
             "data": {"pos": 64, "perm": np.arange(10)}}
    m = manager(tmp_path)
    m.save(9, state, blocking=True)
    step, restored = manager(tmp_path).restore()
    assert step == 9
    restored = to_template(restored, state)
    assert jax.random.key_impl(restored["key"]) == jax.random.key_impl(state["key"])
    assert np.array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    assert np.array_equal(jax.random.normal(restored["key"], (3,)), jax.random.normal(state["key"], (3,)))
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(restored)):
        if hasattr(a, "dtype") and not jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_importing_a_leaf_of_the_library_loads_that_leaf_alone():
    code = ("import sys, respawn.ckpt.checksum\n"
            "print(sorted(m for m in sys.modules if m.startswith('respawn.ckpt')))\n"
            "from respawn.ckpt import TrainingLoop, read_status\n"
            "print('respawn.ckpt.manager' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded, after = out.stdout.split("\n")[:2]
    assert loaded == "['respawn.ckpt', 'respawn.ckpt.checksum']"
    assert after == "True"  # the package's exports are there when asked for
