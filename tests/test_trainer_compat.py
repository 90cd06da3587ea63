"""The private framework APIs the checkpoint uses live in one module per framework (respawn.ckpt.torch_compat,
respawn.ckpt.jax_compat); these tests fail, naming the version each was checked with, when a torch or JAX release
moved or changed one, so that an upgrade cannot silently break sharded saves. Checked with torch==2.13.0 and
jax==0.10.2."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from trainer_helpers import free_port

# Every private name outside the compat modules would escape these tests: the save paths reach none themselves.
PRIVATE = ("torch.distributed._", "torch.distributed.checkpoint._", "_init_optim_state", "jax._src")


def compat(name: str):
    try:
        return importlib.import_module(f"respawn.ckpt.{name}")
    except ImportError as exc:
        pytest.fail(str(exc))  # the module's own message names the version it was checked with


def test_the_private_torch_helpers_still_do_what_the_sharded_save_needs():
    import torch

    tc = compat("torch_compat")
    why = f"torch {torch.__version__}; respawn.ckpt.torch_compat was checked with {tc.CHECKED_WITH}"
    flat, _ = tc.flatten_state_dict({"model": {"w": torch.ones(2)}, "step": 3})
    assert set(flat) == {"model.w", "step"}, why
    staged = tc.create_cpu_state_dict({"w": torch.ones(2)}, pin_memory=False)
    copied = tc.copy_state_dict({"w": torch.full((2,), 5.0)}, staged, non_blocking=False)
    assert copied["w"].tolist() == [5.0, 5.0] and copied["w"] is staged["w"], why
    opt = torch.optim.Adam(torch.nn.Linear(2, 1).parameters())
    tc.init_optim_state(opt)
    assert all("exp_avg" in s for s in opt.state.values()) and opt.state, why


def test_the_private_jax_client_is_where_jax_compat_reads_it():
    import jax

    jc = compat("jax_compat")
    why = f"jax {jax.__version__}; respawn.ckpt.jax_compat was checked with {jc.CHECKED_WITH}"
    assert jc.coordination_client() is None, why  # not initialized in this process
    # The client jax.distributed.initialize connects: one process of a job of one, in a fresh interpreter. Its port
    # is free_port()'s, outside the ephemeral range: one a bind to port 0 found was taken again before JAX bound it
    # (CI: "Failed to add port to server", and the process died of SIGSEGV).
    code = ("import jax\n"
            f"jax.distributed.initialize('127.0.0.1:{free_port()}', 1, 0)\n"
            "from respawn.ckpt.jax_compat import coordination_client\n"
            "c = coordination_client()\n"
            "c.key_value_set('k', 'v')\n"
            "print(c.blocking_key_value_get('k', 1000))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "v", f"{why}:\n{out.stderr[-2000:]}"


def test_no_save_path_reaches_a_private_framework_api_outside_the_compat_modules():
    import pathlib

    trainer = pathlib.Path(__file__).resolve().parent.parent / "trainer"
    reaches = {f"{path.name}: {needle}" for path in trainer.glob("*.py") if not path.name.endswith("_compat.py")
               for needle in PRIVATE if needle in path.read_text()}
    assert not reaches, f"move these into trainer/torch_compat.py or trainer/jax_compat.py: {sorted(reaches)}"
