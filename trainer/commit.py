"""How a step becomes final, for every checkpoint Respawn writes: one type, `Commit`, with its named kinds, and the
store's marker that each of them ends with (docs/checkpoint.md, "How a step becomes final").

    the store's marker  seal(): the manifest, then COMMITTED holding its checksum, each durable before the next
                        (seal_dir in a directory; storage.GCSStore.commit_step in a bucket). Nothing else makes a
                        step final: a commit, an upload and a local copy of a committed step all end with it, a
                        delete removes the marker first, a reader trusts a step whose marker matches its manifest.
    SingleWriter        one process wrote every file and seals the step itself: format.write_checkpoint does so
                        for the one-writer format (CheckpointManager: one process, DDP's rank 0); a manager of one
                        member takes this kind.
    MembersVote         every member of a job wrote a part: each votes with its durable files over a Seam, member 0
                        seals only if every vote is yes, every member returns member 0's outcome; so a member that
                        fails, dies or overruns leaves no torn step.

A commit kind is a class here; a store, its put under seal() (storage.py); a checkpoint layout, a
manager.ShardedManager subclass. Imports nothing of the package but its log and checksums (the format, the stores and
the managers all stand on it), neither torch nor jax.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Literal, Protocol

from respawn import contract

from . import _log, checksum


class SaveState(str, Enum):  # not enum.StrEnum (3.11+): the library runs on 3.10 images
    """How a save ended (the emergency one's is also the status file's `emergency.state`)."""

    COMMITTED = "committed"
    ABANDONED = "abandoned"  # stopped at the deadline or cancelled; its partial directory is removed
    FAILED = "failed"  # an error (in `reason`); the previous committed checkpoint stays the newest

    __str__ = str.__str__  # as StrEnum: "committed", also in f-strings
    __format__ = str.__format__


@dataclass(frozen=True)
class SaveOutcome:
    """The result of one save. durable: "remote" = committed in the checkpoint URI's store (also when that store
    is the local directory itself), "local" = committed on the node's disk only (upload cut short or failed),
    None = not committed."""

    state: SaveState
    step: int
    durable: Literal["local", "remote"] | None = None
    reason: str | None = None
    seconds: float | None = None  # write + commit + upload (emergency: from the call, waiting included)
    nbytes: int | None = None  # bytes written (the manifest's total_bytes); None when nothing was written

    @property
    def committed(self) -> bool:
        return self.state is SaveState.COMMITTED


class Abandoned(Exception):
    """A write stopped before its marker because of the deadline or a cancel; nothing committed was touched."""


@dataclass
class WriteControl:
    """Stops a write between chunks: at `deadline` (time.monotonic()) or when `cancelled()` turns true."""

    deadline: float | None = None
    cancel: object = None  # a threading.Event
    progress: object = None  # callable(bytes_written)

    def check(self, what: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Abandoned(f"cancelled while {what}")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Abandoned(f"deadline reached while {what}")


# ---- the store's marker -------------------------------------------------------------------------------------------

def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durable(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def manifest_bytes(manifest: dict) -> bytes:
    return json.dumps(manifest, indent=1).encode()


def marker_bytes(step: int, manifest_data: bytes, algorithm: str) -> bytes:
    return json.dumps({"step": step, "manifest_checksum": checksum.of_bytes(manifest_data, algorithm),
                       "checksum_algorithm": algorithm}).encode()


def seal(put: Callable[[str, bytes], None], step: int, manifest_data: bytes, marker: bytes,
         control: WriteControl | None = None) -> None:
    """Make a step final in a store: put(name, data) of the manifest, then of the marker, each returning once durable;
    the control is checked once more before the marker. The step's data files must be durable there already.
    marker: marker_bytes(...) for a new commit, a committed step's own for a copy of it."""
    put(contract.CHECKPOINT_MANIFEST, manifest_data)
    if control is not None:
        control.check(f"committing step {step}")
    put(contract.CHECKPOINT_MARKER, marker)


def seal_dir(step_dir: str, step: int, manifest_data: bytes, marker: bytes, control: WriteControl | None = None) -> None:
    """seal() in a directory: each file fsync'd, then the directory; at the end the parent, which holds the step's
    name."""
    def put(name: str, data: bytes) -> None:
        write_file_durable(os.path.join(step_dir, name), data)
        fsync_dir(step_dir)

    seal(put, step, manifest_data, marker, control)
    fsync_dir(os.path.dirname(step_dir))


# ---- the kinds of commit ------------------------------------------------------------------------------------------

Decide = Callable[[list], "tuple[SaveOutcome, dict | None]"]


class Commit(Protocol):
    """How one member's part of a step becomes the job's step. vote: this member's {"ok": True, ...} (its files
    durable; what the layout's manifest needs) or {"ok": False, "late", "reason"}. decide(votes) runs on the member
    that seals: it builds the manifest, seals it (the store's marker) and returns (outcome, the manifest sealed or
    None). Every member returns the same outcome; the manifest where decide ran, else None."""

    def commit(self, step: int, vote: dict, control: WriteControl | None,
               decide: Decide) -> tuple[SaveOutcome, dict | None]: ...


class SingleWriter:
    """One process holds every file of the step: its vote is the only one, and it decides and seals itself."""

    def commit(self, step: int, vote: dict, control: WriteControl | None,
               decide: Decide) -> tuple[SaveOutcome, dict | None]:
        return decide([vote])


class Seam(Protocol):
    """How the members of a job exchange a few bytes: all_gather returns every member's, in rank order; broadcast
    member 0's (`data` there, ignored elsewhere). `key` names the exchange (the key-value store's keys; a process
    group's collectives are ordered and ignore it). A wait stops with Abandoned, or the transport's error, at
    the control's deadline or cancel (no control: the transport's own timeout)."""

    rank: int
    size: int

    def all_gather(self, key: str, data: bytes, control: WriteControl | None = None) -> list[bytes]: ...
    def broadcast(self, key: str, data: bytes | None, control: WriteControl | None = None) -> bytes: ...


def votes_key(step: int) -> str:
    return f"respawn/ckpt/{step}/votes"


class MembersVote:
    """The two-phase commit over a Seam (torch_sharded.GroupSeam, a gloo group of the checkpoint's own;
    jax_distributed.KeyValueSeam, the coordination service's key-value store): the votes meet, member 0 decides,
    every member returns member 0's outcome."""

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def commit(self, step: int, vote: dict, control: WriteControl | None,
               decide: Decide) -> tuple[SaveOutcome, dict | None]:
        seam = self.seam
        try:
            votes = [json.loads(v) for v in seam.all_gather(votes_key(step), json.dumps(vote).encode(), control)]
        except Exception as exc:  # noqa: BLE001 - a member gone, the deadline or a cancel: no commit
            _log.error("checkpoint: the votes did not all arrive; not committed", step=step, rank=seam.rank,
                       error=f"{type(exc).__name__}: {exc}")
            return SaveOutcome(SaveState.ABANDONED, step, reason=f"commit vote: {type(exc).__name__}: {exc}"), None
        outcome, manifest = decide(votes) if seam.rank == 0 else (None, None)
        word = json.dumps([outcome.state.value, outcome.durable, outcome.reason]).encode() if outcome else None
        try:
            state, durable, reason = json.loads(seam.broadcast(f"respawn/ckpt/{step}/outcome", word, control))
        except Exception as exc:  # noqa: BLE001 - member 0's marker alone decides; the others do not know it
            if seam.rank == 0:
                _log.warning("could not tell the other members the commit's outcome", step=step, error=str(exc))
                return outcome, manifest
            return SaveOutcome(SaveState.ABANDONED, step,
                               reason=f"member 0's commit not received: {type(exc).__name__}: {exc}"), None
        return (outcome, manifest) if seam.rank == 0 else (SaveOutcome(SaveState(state), step, durable, reason), None)


def of_members(seam: Seam) -> Commit:
    """The commit of a job whose members are `seam`'s: a vote when there are several, else the single writer."""
    return MembersVote(seam) if seam.size > 1 else SingleWriter()
