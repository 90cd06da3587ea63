"""The two-phase commit of a step that every member of a job writes a part of (the ranks of a sharded torch job,
torch_sharded.py; the processes of a multi-process JAX job, jax_distributed.py), over one small seam
(torch_sharded.GroupSeam, a gloo group of the checkpoint's own; jax_distributed.KeyValueSeam, the coordination
service's key-value store): every member votes with its durable files, and member 0 writes the manifest and
COMMITTED only if every vote is yes, so a member that fails, dies or overruns leaves no torn step. Restore agrees on
the newest step every member can load. The protocol in full: docs/checkpoint.md ("Sharded state (FSDP2, DTensor) on
DCP"). Importing it imports neither torch nor jax.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from dataclasses import replace
from typing import Any, Callable, Protocol

from . import _log, format as fmt, hosts
from .manager import CheckpointManager, SaveOutcome, SaveState, unrestorable


class Seam(Protocol):
    """How the members of a job exchange a few bytes: all_gather returns every member's, in rank order; broadcast
    member 0's (`data` there, ignored elsewhere). `key` names the exchange (the key-value store's keys; a process
    group's collectives are ordered and ignore it). A wait stops with fmt.Abandoned, or the transport's error, at the
    control's deadline or cancel (no control: the transport's own timeout)."""

    rank: int
    size: int

    def all_gather(self, key: str, data: bytes, control: fmt.WriteControl | None = None) -> list[bytes]: ...
    def broadcast(self, key: str, data: bytes | None, control: fmt.WriteControl | None = None) -> bytes: ...


def votes_key(step: int) -> str:
    return f"respawn/ckpt/{step}/votes"


def commit_round(seam: Seam, step: int, vote: dict, control: fmt.WriteControl | None,
                 decide: Callable[[list[dict]], tuple[SaveOutcome, dict | None]]) -> tuple[SaveOutcome, dict | None]:
    """Phase 2 on one member: the votes meet, member 0 decides (decide(votes): its outcome and the manifest it
    committed, or None), every member returns member 0's outcome. Returns (outcome, manifest: member 0's only)."""
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


class ShardedManager(CheckpointManager):
    """A CheckpointManager for one member of a job whose members all write (one per member: every member calls
    save, emergency_save and restore, in the same order). The notice, the deadline, the asynchronous periodic saves
    and the status file work as for one process; member 0 alone commits, uploads a shared directory's step and
    applies retention. A subclass names its layout and implements, for one member:
    _write_files(step, payload, control) -> its vote: its part durable, with `files` {name: {size, checksum}} (on
        hosts with disks of their own, uploaded next) and what _manifest_extra(votes) reads, which returns the
        layout's manifest fields (raising when the votes do not add up);
    _open_for_restore(store, step) -> (member 0) the step's directory, checked enough to offer it to every member;
    _load_part(step, step_dir, like) -> (manifest, this member's state) of the step member 0 offered."""

    layout = framework = members = ""  # the manifest's layout and framework; what the members are ("ranks")

    def __init__(self, *args: Any, seam: Seam, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seam, self._rank = seam, seam.rank
        self._per_host: bool | None = None  # known after the first exchange (restore, or the first save)
        self._host_leader = False
        self._exchanges = itertools.count()

    def _alone(self, work: Callable[[], Any]) -> Any:
        """Member 0 runs `work` while the others wait (the torch group keeps a heartbeat); its result there."""
        return work() if self._rank == 0 else None

    def _find_hosts(self) -> None:
        """Whether the members have checkpoint directories of their own (hosts with their own disks), and what
        follows: every member uploads its files and member 0 commits in the remote store, which is required.
        Otherwise member 0 alone uploads each committed step. Collective: every member calls it, once."""
        if self._per_host is not None:
            return
        groups = hosts.shared_groups(self.local.root, self._rank, lambda data: self._seam.all_gather(
            f"respawn/hosts/{next(self._exchanges)}", data))
        self._per_host = hosts.per_host(groups, self.remote is not None, self.members)
        self._host_leader = any(g[0] == self._rank for g in groups)
        if not self._per_host and self._rank != 0:
            self.remote = None  # member 0 uploads each committed step (the directory is shared), no one else

    # ---- the two-phase commit -------------------------------------------------------------------------------

    def _write_and_ship(self, step, kind, payload, control, retention) -> SaveOutcome:
        started = time.monotonic()
        try:
            self._find_hosts()
            vote = {"ok": True, **self._write_files(step, payload, control)}
            if self._per_host:  # every member's files are in the remote store before it votes
                self.remote.put_files(self.local.step_dir(step), step, list(vote["files"]), control)
        except Exception as exc:  # noqa: BLE001 - this member votes no; member 0 then does not commit
            late = isinstance(exc, fmt.Abandoned)
            vote = {"ok": False, "late": late, "reason": str(exc) if late else f"{type(exc).__name__}: {exc}"}
            if not late:
                _log.error("checkpoint: this member's part failed", step=step, rank=self._rank, error=vote["reason"])
        outcome, manifest = commit_round(self._seam, step, vote, control,
                                         lambda votes: self._decide(step, kind, votes, control, started))
        if self._rank != 0:
            if self._per_host and self._host_leader:
                for old in [s for s in self.local.steps() if s <= step]:  # sent or useless: the remote decides
                    self.local.delete_step(old)
            if outcome.committed:
                self._committed(step, kind, outcome.durable)  # this node's status file, if it keeps one
                if self._per_host:
                    self._remote_committed.add(step)
        elif outcome.committed:
            if self.remote is not None and not self._per_host:  # member 0 reads every file: the directory is shared
                durable, reason = self._ship(step, kind, manifest, control)
                outcome = replace(outcome, durable=durable, reason=reason)
            if retention:  # steps above this one may hold other members' parts of the next save: keep them
                self.apply_retention(protect={s for s in self.local.steps() if s >= step})
        return replace(outcome, seconds=round(time.monotonic() - started, 3),
                       nbytes=manifest["total_bytes"] if manifest else None)

    def _decide(self, step, kind, votes: list[dict], control, started) -> tuple[SaveOutcome, dict | None]:
        """Member 0: the manifest and the marker, only when every member's files are durable and accounted for."""
        no = {r: v["reason"] for r, v in enumerate(votes) if not v["ok"]}
        if no:
            _log.warning("checkpoint not committed: a member did not finish its part; the previous committed "
                         "checkpoint stays the newest", step=step, members=no)
            late = all(votes[r].get("late") for r in no)
            return SaveOutcome(SaveState.ABANDONED if late else SaveState.FAILED, step,
                               reason="; ".join(f"member {r}: {why}" for r, why in no.items())), None
        store = self.remote if self._per_host else self.local
        try:
            files = {name: meta for v in votes for name, meta in v["files"].items()}
            manifest = fmt.new_manifest(step, kind, self.framework, "remote" if self.remote is None or self._per_host
                                        else "local", files, layout=self.layout, job_id=self.job_id,
                                        attempt=self.attempt, **self._manifest_extra(votes))
            control.check(f"committing step {step}")
            if self._per_host:  # every member uploaded its files before it voted: commit where they are
                self.remote.commit_step(step, manifest, control)
                self._remote_committed.add(step)
            else:
                self._commit_here(step, manifest, control)
        except fmt.Abandoned as exc:
            _log.warning("checkpoint abandoned", step=step, reason=str(exc))
            return SaveOutcome(SaveState.ABANDONED, step, reason=str(exc)), None
        except Exception as exc:  # noqa: BLE001 - reported; the previous committed step stays the newest
            self.last_error = f"{type(exc).__name__}: {exc}"
            _log.error("checkpoint commit failed", step=step, error=self.last_error)
            return SaveOutcome(SaveState.FAILED, step, reason=self.last_error), None
        self._kinds[(store.uri, step)] = kind
        self._committed(step, kind, manifest["durable"])
        _log.info("checkpoint committed", step=step, kind=kind, members=len(votes), bytes=manifest["total_bytes"],
                  seconds=round(time.monotonic() - started, 3), store=store.uri)
        return SaveOutcome(SaveState.COMMITTED, step, manifest["durable"]), manifest

    def _commit_here(self, step: int, manifest: dict, control: fmt.WriteControl) -> None:
        step_dir = self.local.step_dir(step)
        tops = {name.split("/", 1)[0] for name in manifest["files"]}  # a framework's files may sit in folders
        for name in os.listdir(step_dir):  # leftovers of an earlier attempt at this step
            if name not in tops:
                path = os.path.join(step_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        for name, want in manifest["files"].items():  # the others wrote into this directory: it must be one
            path = os.path.join(step_dir, name)
            if not os.path.exists(path) or os.path.getsize(path) != want["size"]:
                raise fmt.CorruptCheckpoint(f"{name} is not in {step_dir} with {want['size']} bytes: every member "
                                            "must write into the same checkpoint directory (a shared filesystem)")
        fmt.fsync_dir(step_dir)  # every member's files are fsync'd; their names now too
        fmt.commit(step_dir, step, json.dumps(manifest, indent=1).encode(), control)

    # ---- restore ------------------------------------------------------------------------------------------------

    def restore(self, step: int | None = None, like: Any = None) -> tuple[int, Any] | None:
        started = time.monotonic()
        self._find_hosts()
        candidates = self._verified_steps(self._open_for_restore, only=step) if self._rank == 0 else iter(())
        failed: dict[int, str] = {}  # steps member 0 offered that some member could not load

        def offer() -> bytes:
            try:
                s, _, step_dir = next(candidates, (-1, None, None))
                return json.dumps({"step": s, "dir": step_dir}).encode()
            except fmt.NotRestorable as exc:  # every member raises it, not member 0 alone
                return json.dumps({"step": -1, "error": str(exc)}).encode()

        for attempt in itertools.count():
            offered = json.loads(self._seam.broadcast(f"respawn/restore/{attempt}", self._alone(offer)))
            if offered.get("error"):
                raise fmt.NotRestorable(offered["error"])
            s = offered["step"]
            if s < 0:
                if failed:
                    raise unrestorable(failed, self.local.uri, self.remote.uri if self.remote else None)
                return None
            try:
                manifest, state = self._load_part(s, offered["dir"], like)
                why = ""
            except Exception as exc:  # noqa: BLE001 - told to every member: all go on to the next older step
                why = f"{type(exc).__name__}: {exc}"
                _log.warning("checkpoint unusable on this member; falling back to an older one", step=s,
                             rank=self._rank, reason=why)
            whys = [w.decode() for w in self._seam.all_gather(f"respawn/restore/{attempt}/loaded", why.encode())]
            if any(whys):
                failed[s] = "; ".join(f"member {r}: {w}" for r, w in enumerate(whys) if w)
                continue
            if self._per_host:  # every member knows the same committed steps: this one, and those from here on
                self._remote_committed = {s}
            self._restored(s, manifest, members=self._seam.size, dir=offered["dir"],
                           seconds=round(time.monotonic() - started, 3))
            return s, state
