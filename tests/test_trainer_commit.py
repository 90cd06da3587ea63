"""The two-phase commit of respawn.ckpt.commit, which both multi-writer managers run (torch_sharded over a gloo group,
jax_distributed over the coordination key-value store), here with 3 members as threads of one process exchanging
through an in-memory seam, and a layout of one file per member. A member whose vote never comes (it dies at the
vote) leaves the step without COMMITTED on every member's side; one whose write fails makes the step FAILED, one
past the deadline ABANDONED; restore agrees on the newest step every member can load. The real transports:
tests/test_trainer_sharded.py (a rank killed before its vote) and tests/test_trainer_jax_distributed.py (a process
killed mid-save). Last, the store's marker every kind of commit ends with: the manifest's checksum, written last, so an
upload cut before it leaves a step that is never read."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from respawn.ckpt import checksum, commit, format as fmt
from respawn.ckpt.manager import CheckpointManager, SaveState, ShardedManager
from respawn.ckpt.serialize import flatten
from respawn.ckpt.storage import LocalStore

MEMBERS = 3


class Died(BaseException):
    """A member gone (os._exit in the real tests): its thread ends without another word."""


class Exchange:
    """The members' meeting place: values by key, waits bounded by the control like the real seams'."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def put(self, key: str, value: bytes) -> None:
        with self.cond:
            self.values[key] = value
            self.cond.notify_all()

    def get(self, key: str, control) -> bytes:
        with self.cond:
            while key not in self.values:
                if control is not None:
                    control.check(f"waiting for {key}")
                self.cond.wait(0.02)
            return self.values[key]


class ThreadSeam:
    def __init__(self, exchange: Exchange, rank: int, dies_at: str | None = None) -> None:
        self.exchange, self.rank, self.size, self.dies_at = exchange, rank, MEMBERS, dies_at

    def all_gather(self, key, data, control=None):
        if key == self.dies_at:
            raise Died
        self.exchange.put(f"{key}/{self.rank}", data)
        return [self.exchange.get(f"{key}/{r}", control) for r in range(self.size)]

    def broadcast(self, key, data, control=None):
        if self.rank == 0:
            self.exchange.put(key, data)
            return data
        return self.exchange.get(key, control)


class OneFileEach(ShardedManager):
    """The smallest layout: each member writes its state (bytes) to one file of the step."""

    layout, framework, members = "one-file-each", "test", "members"
    fail_write: set[int] = set()

    def _flatten(self, state, copy):
        return state

    def _write_files(self, step, payload, control):
        if self._rank in self.fail_write:
            raise OSError("disk full")
        control.check(f"writing step {step}")
        name = f"m{self._rank}.bin"
        os.makedirs(self.local.step_dir(step), exist_ok=True)
        path = os.path.join(self.local.step_dir(step), name)
        fmt.write_file_durable(path, payload)
        size, digest = checksum.of_file(path)
        return {"files": {name: {"size": size, "checksum": digest}}}

    def _manifest_extra(self, votes):
        return {"members": len(votes)}

    def _open_for_restore(self, store, step):
        step_dir = store.get_step(step, self.local.root)
        fmt.verify(step_dir)
        return step_dir

    def _load_part(self, step, step_dir, like):
        with open(os.path.join(step_dir, f"m{self._rank}.bin"), "rb") as f:
            return fmt.read_manifest(step_dir), f.read()


def run(root, work, dies_at: dict[int, str] | None = None, budget_s: float = 2.0) -> list:
    """work(manager) on every member, each on a thread with its manager; the results (None: the member died). An
    exception on a member is raised here."""
    exchange, results, errors = Exchange(), [None] * MEMBERS, []

    def member(rank: int) -> None:
        seam = ThreadSeam(exchange, rank, (dies_at or {}).get(rank))
        mgr = OneFileEach(local_dir=str(root), seam=seam, notice_budget_s=budget_s)
        try:
            results[rank] = work(mgr)
        except Died:
            pass
        except Exception as exc:  # noqa: BLE001 - raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(MEMBERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a member never returned"
    if errors:
        assert len(errors) == MEMBERS, f"only some members raised: {errors}"  # a member alone would hang the job
        raise errors[0]
    return results


def emergency(step: int):
    def work(mgr):
        mgr.request_preemption("test")
        return mgr.emergency_save(step, f"member {mgr._rank} at {step}".encode())
    return work


def test_every_vote_commits_the_step_on_every_member_and_it_restores(tmp_path):
    outcomes = run(tmp_path, emergency(5))
    assert [o.state for o in outcomes] == [SaveState.COMMITTED] * MEMBERS
    manifest = fmt.verify(str(tmp_path / fmt.step_dirname(5)))
    assert sorted(manifest["files"]) == ["m0.bin", "m1.bin", "m2.bin"] and manifest["layout"] == "one-file-each"
    assert run(tmp_path, lambda mgr: mgr.restore()) == [(5, f"member {r} at 5".encode()) for r in range(MEMBERS)]


def test_one_members_vote_removed_leaves_no_committed_and_the_previous_step_restores(tmp_path):
    run(tmp_path, emergency(5))
    # Member 1 writes its file and dies at the vote: the others wait out the deadline, member 0 writes nothing.
    # Without the vote round member 0 would commit the files it sees and the next restore would start at step 6.
    outcomes = run(tmp_path, emergency(6), dies_at={1: commit.votes_key(6)}, budget_s=1.0)
    assert outcomes[1] is None
    assert [outcomes[r].state for r in (0, 2)] == [SaveState.ABANDONED] * 2, outcomes
    assert (tmp_path / fmt.step_dirname(6) / "m1.bin").exists()
    assert not (tmp_path / fmt.step_dirname(6) / fmt.MARKER).exists()
    assert run(tmp_path, lambda mgr: mgr.restore()) == [(5, f"member {r} at 5".encode()) for r in range(MEMBERS)]


def test_a_failed_write_fails_the_step_and_every_member_hears_why(tmp_path, monkeypatch):
    monkeypatch.setattr(OneFileEach, "fail_write", {2})
    outcomes = run(tmp_path, emergency(7))
    assert [o.state for o in outcomes] == [SaveState.FAILED] * MEMBERS
    assert all("member 2: OSError: disk full" in o.reason for o in outcomes), outcomes
    assert not (tmp_path / fmt.step_dirname(7) / fmt.MARKER).exists()


def test_a_member_past_the_deadline_abandons_the_step(tmp_path):
    outcomes = run(tmp_path, emergency(8), budget_s=0.0)  # the deadline has passed before anyone writes
    assert [o.state for o in outcomes] == [SaveState.ABANDONED] * MEMBERS
    assert not (tmp_path / fmt.step_dirname(8) / fmt.MARKER).exists()


def test_a_step_no_member_can_load_is_not_restored_from_scratch(tmp_path):
    run(tmp_path, emergency(5))
    os.remove(tmp_path / fmt.step_dirname(5) / "m2.bin")  # committed, then damaged
    with pytest.raises(fmt.NotRestorable, match="step 5"):
        run(tmp_path, lambda mgr: mgr.restore())


class StopBeforeMarker:
    """A control whose deadline passes between the manifest and the marker (seal checks it there, nowhere else)."""

    def check(self, what: str) -> None:
        if what.startswith("committing"):
            raise fmt.Abandoned(f"deadline reached while {what}")


def test_the_stores_marker_is_the_manifests_checksum_written_last_and_a_copy_cut_before_it_is_not_committed(tmp_path):
    src = LocalStore(str(tmp_path / "src"))
    manifest = fmt.write_checkpoint(src.root, 3, "periodic", flatten({"w": np.arange(6.0)}, copy=False))
    data = (tmp_path / "src" / fmt.step_dirname(3) / fmt.MANIFEST).read_bytes()
    marker = json.loads((tmp_path / "src" / fmt.step_dirname(3) / fmt.MARKER).read_bytes())
    assert marker == {"step": 3, "manifest_checksum": checksum.of_bytes(data), "checksum_algorithm": "crc32"}
    dst = LocalStore(str(tmp_path / "dst"))
    with pytest.raises(fmt.Abandoned):  # an upload stopped at the deadline: files and manifest there, no marker
        dst.put_step(src.step_dir(3), 3, manifest, StopBeforeMarker())
    assert (tmp_path / "dst" / fmt.step_dirname(3) / fmt.MANIFEST).exists() and dst.steps() == {3: False}
    assert CheckpointManager(local_dir=dst.root).restore() is None  # never read as a step
    dst.put_step(src.step_dir(3), 3, manifest)
    assert dst.steps() == {3: True} and CheckpointManager(local_dir=dst.root).restore()[0] == 3
