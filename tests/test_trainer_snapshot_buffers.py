"""SnapshotBuffers (trainer/serialize.py): a periodic snapshot's copy of the parameters and optimizer state, left to a
thread, is the state of the save's step even when an optimizer step comes at once, and reuses its buffers."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from respawn.ckpt.serialize import SnapshotBuffers  # noqa: E402


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.BatchNorm1d(1024))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(8, 1024)).sum().backward()
    optimizer.step()
    return model, optimizer


def snapshot(buffers, model, optimizer):
    later, index = [], itertools.count()
    params = {p.data_ptr() for p in model.parameters()}
    weights = buffers.copy_tree(model.state_dict(), index, later, params)
    state = buffers.copy_tree(optimizer.state_dict(), index, later)
    buffers.copy_until_step(later)
    return later, weights, state


def test_an_optimizer_step_at_once_waits_for_the_copy_and_the_copy_is_the_saves_step():
    model, optimizer = model_and_optimizer()
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}
    expected_moments = {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()}
    buffers = SnapshotBuffers()
    later, weights, state = snapshot(buffers, model, optimizer)
    # Parameters and moments left to the thread; the norm's running statistics (changed by a forward) copied now.
    deferred = {t.data_ptr() for _, t in later}
    assert deferred >= {p.data_ptr() for p in model.parameters()}
    assert model[1].running_mean.data_ptr() not in deferred

    model(torch.randn(8, 1024)).sum().backward()  # the next step: a forward changes the running statistics
    optimizer.step()  # ... and the step changes the parameters and moments (after the copy)
    buffers.wait()

    assert all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights)
    assert all(torch.equal(state["state"][i][k], v) for i, s in expected_moments.items() for k, v in s.items())
    assert not torch.equal(model[0].weight, expected_weights["0.weight"])  # the live model did move on
    assert not torch.equal(model[1].running_mean, expected_weights["1.running_mean"])


def test_the_next_snapshot_reuses_the_buffers_and_the_hook_is_gone_after_wait():
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    model, optimizer = model_and_optimizer()
    buffers = SnapshotBuffers()
    _, first, _ = snapshot(buffers, model, optimizer)
    buffers.wait()
    assert not _global_optimizer_pre_hooks
    optimizer.step()
    _, second, _ = snapshot(buffers, model, optimizer)
    buffers.wait()
    assert all(first[k].data_ptr() == second[k].data_ptr() for k in first)
    assert torch.equal(second["0.weight"], model[0].weight)


def test_a_failed_copy_is_raised_by_wait_not_by_the_optimizer_step():
    model, optimizer = model_and_optimizer()
    buffers = SnapshotBuffers()
    buffers.copy_until_step([(torch.empty(3), torch.empty(4))])  # a copy that cannot be made
    optimizer.step()  # training goes on
    with pytest.raises(RuntimeError):
        buffers.wait()
