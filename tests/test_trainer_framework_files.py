"""respawn.ckpt.framework_files: a step a framework writes in its own format, committed with Respawn's protocol. The
members of a job are threads here, each with its own manager, over an in-process seam (the torch and JAX seams are
exercised by the integrations' torchrun and jax.distributed tests)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from respawn.ckpt import commit, format as fmt
from respawn.ckpt.framework_files import Files, FilesManager


class ThreadSeam:
    """The members' exchanges between threads of one process; `dies` names an exchange key at which this member
    stops for good (a member killed there)."""

    def __init__(self, board: dict, cond: threading.Condition, rank: int, size: int, dies: str | None = None):
        self.board, self.cond, self.rank, self.size, self.dies = board, cond, rank, size, dies

    def all_gather(self, key, data, control=None):
        if key == self.dies:
            raise SystemExit("member killed")
        with self.cond:
            self.board[(key, self.rank)] = data
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: all((key, r) in self.board for r in range(self.size)), timeout=10):
                raise TimeoutError(f"exchange {key}: a member never came")
            return [self.board[(key, r)] for r in range(self.size)]

    def broadcast(self, key, data, control=None):
        return self.all_gather(key, data if self.rank == 0 else b"", control)[0]


def run_members(size: int, body, dies: dict[int, str] | None = None) -> list:
    board, cond, results = {}, threading.Condition(), [None] * size

    def run(rank):
        try:
            results[rank] = body(rank, ThreadSeam(board, cond, rank, size, (dies or {}).get(rank)))
        except BaseException as exc:  # noqa: BLE001 - the test reads each member's end
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def framework_save(rank: int, payload: bytes):
    """What a framework's save writes: member 0 the model and a folder; every member its own RNG file."""

    def now(step_dir):
        if rank == 0:
            with open(os.path.join(step_dir, "model.bin"), "wb") as f:
                f.write(payload)
            os.makedirs(os.path.join(step_dir, "optim", "shard"), exist_ok=True)
            with open(os.path.join(step_dir, "optim", "shard", "0.bin"), "wb") as f:
                f.write(payload[::-1])

    def later(step_dir):
        with open(os.path.join(step_dir, f"rng_{rank}.json"), "w") as f:
            json.dump({"rank": rank}, f)

    return Files(now=now, later=later)


def test_one_process_commits_what_the_framework_wrote_and_restores_the_newest_that_verifies(tmp_path):
    mgr = FilesManager(local_dir=str(tmp_path / "ckpt"), framework="demo", keep=5)
    assert mgr.save(10, framework_save(0, b"ten" * 100)) is None  # asynchronous: the commit is on its own thread
    assert mgr.wait().committed
    assert mgr.save(20, framework_save(0, b"twenty" * 100), blocking=True).committed
    manifest = fmt.read_manifest(mgr.local.step_dir(20))
    assert manifest["layout"] == "framework-files" and manifest["framework"] == "demo"
    assert sorted(manifest["files"]) == ["model.bin", "optim/shard/0.bin", "rng_0.json"]

    with open(os.path.join(mgr.local.step_dir(20), "optim", "shard", "0.bin"), "r+b") as f:
        f.write(b"X")  # bit rot in a nested file of the newest step
    again = FilesManager(local_dir=str(tmp_path / "ckpt"), framework="demo")
    step, step_dir = again.restore()
    assert step == 10
    assert open(os.path.join(step_dir, "model.bin"), "rb").read() == b"ten" * 100

    other = FilesManager(local_dir=str(tmp_path / "ckpt"), framework="lightning")
    with pytest.raises(fmt.NotRestorable, match="also tried steps \\[10\\]"):
        other.restore()


def test_a_leftover_of_an_earlier_attempt_is_not_committed_with_the_step(tmp_path):
    mgr = FilesManager(local_dir=str(tmp_path), framework="demo")
    os.makedirs(mgr.local.step_dir(5))
    open(os.path.join(mgr.local.step_dir(5), "stale.bin"), "wb").write(b"old")
    assert mgr.emergency_save(5, framework_save(0, b"x")).committed
    assert "stale.bin" not in fmt.verify(mgr.local.step_dir(5))["files"]


def test_every_members_files_commit_once_all_voted_and_every_member_restores_the_step(tmp_path):
    def body(rank, seam):
        mgr = FilesManager(local_dir=str(tmp_path / "ckpt"), framework="demo", seam=seam)
        outcome = mgr.save(3, framework_save(rank, b"w" * 64), blocking=True)
        return outcome, mgr.restore()

    results = run_members(2, body)
    for outcome, (step, step_dir) in results:
        assert outcome.committed and step == 3
        assert sorted(fmt.verify(step_dir)["files"]) == ["model.bin", "optim/shard/0.bin", "rng_0.json", "rng_1.json"]


def test_a_member_killed_before_its_vote_leaves_no_committed_step(tmp_path):
    def body(rank, seam):
        mgr = FilesManager(local_dir=str(tmp_path / "ckpt"), framework="demo", seam=seam)
        assert mgr.save(1, framework_save(rank, b"a"), blocking=True).committed
        return mgr.save(2, framework_save(rank, b"b"), blocking=True)

    results = run_members(2, body, dies={1: commit.votes_key(2)})
    assert results[1] is None  # its save's thread ended at the vote: no outcome
    assert not results[0].committed  # member 0 waited for a vote that never came
    steps = FilesManager(local_dir=str(tmp_path / "ckpt"), framework="demo").local.steps()
    assert steps == {1: True, 2: False}


def test_hosts_with_disks_of_their_own_commit_in_the_remote_store_and_restore_on_every_host(tmp_path):
    remote = tmp_path / "bucket"

    def body(rank, seam):
        mgr = FilesManager(str(remote), str(tmp_path / f"host{rank}"), framework="demo", seam=seam)
        outcome = mgr.save(7, framework_save(rank, b"m" * 32), blocking=True)
        fresh = FilesManager(str(remote), str(tmp_path / f"fresh{rank}"), framework="demo", seam=seam)
        return outcome, fresh.restore()

    results = run_members(2, body)
    assert fmt.read_manifest(str(remote / fmt.step_dirname(7)))["members"] == 2
    for rank, (outcome, (step, step_dir)) in enumerate(results):
        assert outcome.committed and outcome.durable == "remote" and step == 7
        assert step_dir.startswith(str(tmp_path / f"fresh{rank}"))
        assert sorted(fmt.verify(step_dir)["files"]) == ["model.bin", "optim/shard/0.bin", "rng_0.json", "rng_1.json"]


def test_a_save_of_anything_but_files_is_refused_in_one_line(tmp_path):
    mgr = FilesManager(local_dir=str(tmp_path), framework="demo")
    with pytest.raises(TypeError, match="saves a respawn.ckpt.framework_files.Files"):
        mgr.save(1, {"model": 1}, blocking=True)


def test_a_periodic_save_in_flight_at_the_notice_commits_if_it_can_and_the_emergency_save_follows(tmp_path):
    """Cancelling the older save at once lost it, and under load the emergency save then missed its deadline too: a
    restart found nothing (the hf-multi-node scenario, at a load average of 30). It gets half the time left first."""
    mgr = FilesManager(local_dir=str(tmp_path), framework="demo", notice_budget_s=6)

    def slow(step_dir):
        time.sleep(1.0)
        open(os.path.join(step_dir, "model.bin"), "wb").write(b"periodic")

    mgr.save(5, Files(later=slow))
    mgr.request_preemption("test")
    outcome = mgr.emergency_save(6, framework_save(0, b"emergency"))
    assert outcome.committed
    assert mgr.local.steps() == {5: True, 6: True}
