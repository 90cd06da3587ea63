"""CheckpointManager: periodic asynchronous saves and their upload, the deadline-bound emergency save, restore and
progress reporting, delegating the preemption notice (notice.py), the restore's search with its fallback
(restore.py) and retention (retention.py). Framework-neutral: the state is any nesting of dicts/lists/tuples holding
PyTorch tensors, JAX arrays, NumPy arrays and picklable objects (see serialize.py); respawn.ckpt.torch_state and
respawn.ckpt.jax_state build such states from models, optimizers and RNGs.
ShardedManager: the same for one member of a job whose members all write a part of each step (torch_sharded,
jax_distributed, framework_files). How either commits a step: respawn.ckpt.commit.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from typing import Any, Callable, Iterator, Protocol

from respawn import contract

from . import _log, commit, format as fmt, hosts, peers as peer_reads, restore, retention
from .commit import SaveOutcome, SaveState, Seam
from .notice import Notice, ignore_children
from .serialize import SnapshotBuffers, flatten
from .status import StatusWriter
from .storage import LocalStore, open_store

PREEMPTED_EXIT_CODE = contract.EXIT_PREEMPTED  # stopped on a preemption notice, training not finished; restart me
DEFAULT_NOTICE_BUDGET_S = contract.DEFAULT_NOTICE_BUDGET_SECONDS
DEFAULT_KEEP = 3


class Manager(Protocol):
    """What TrainingLoop and a job use of a checkpoint manager: CheckpointManager (one process; DDP's ranks),
    TorchShardedManager and ShardedCheckpointManager. restore() means the same on each: (step, state) of the newest
    committed step that verifies (`step`: that one only), or None; where every member writes shards, every member
    calls it and all get the same step, loaded into `like` (the objects restored in place) for DCP."""

    status: StatusWriter
    store_error: str | None  # set when this run's first save could not write a store (the loop then stops)

    @property
    def preemption_requested(self) -> bool: ...
    @property
    def notice_at(self) -> float | None: ...
    def install_notice_handler(self, signals: tuple[int, ...] = ...) -> dict | None: ...
    def request_preemption(self, reason: str = ..., notice_at: float | None = None) -> None: ...
    def deadline(self) -> float: ...
    def report_step(self, step: int) -> None: ...
    def prepare_snapshot(self, state: Any) -> None: ...
    def save(self, step: int, state: Any, *, blocking: bool = ..., kind: str = ...) -> SaveOutcome | None: ...
    def emergency_save(self, step: int, state: Any) -> SaveOutcome: ...
    def note_outcome(self, outcome: SaveOutcome, kind: str) -> None: ...
    def finish(self, step: int) -> None: ...
    def close(self) -> None: ...
    def where(self) -> str: ...
    def discard_checkpoints(self) -> list[str]: ...
    def restore(self, step: int | None = None, like: Any = None) -> tuple[int, Any] | None: ...


class CheckpointManager:
    """One per training process.

    checkpoint_uri: where checkpoints must end up (gs://bucket/prefix, file:///abs/path or a path).
    local_dir: the node's own disk; every save is written and committed here first, then copied to
    checkpoint_uri (skipped when both are the same directory). Defaults to a temp dir for a gs:// URI.
    install_signal_handler: install the SIGTERM handler now, for the rest of the process (TrainingLoop installs
    it for the loop's duration instead; see also install_notice_handler()).
    """

    def __init__(self, checkpoint_uri: str | None = None, local_dir: str | None = None, *, keep: int = DEFAULT_KEEP,
                 notice_budget_s: float | None = None, status_file: str | None = None,
                 total_steps: int | None = None, install_signal_handler: bool = False,
                 shard_bytes: int = fmt.DEFAULT_SHARD_BYTES, job_id: str | None = None,
                 attempt: int | None = None) -> None:
        if checkpoint_uri is None and local_dir is None:
            raise ValueError("CheckpointManager needs checkpoint_uri or local_dir (or use from_env)")
        remote = open_store(checkpoint_uri) if checkpoint_uri else None
        if local_dir is None:
            local_dir = remote.root if isinstance(remote, LocalStore) else tempfile.mkdtemp(prefix="respawn-ckpt-")
        self.local = LocalStore(local_dir)
        self.remote = None if isinstance(remote, LocalStore) and remote.root == self.local.root else remote
        os.makedirs(self.local.root, exist_ok=True)
        self.keep = keep
        self._notice = Notice(DEFAULT_NOTICE_BUDGET_S if notice_budget_s is None else float(notice_budget_s))
        self.shard_bytes = shard_bytes
        self.job_id, self.attempt = job_id, attempt
        self.status = StatusWriter(status_file, total_steps)
        self._buffers = SnapshotBuffers()
        self._prepare_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._inflight: dict | None = None  # {"step", "thread", "cancel", "result"}
        self._kinds: dict[tuple[str, int], str] = {}
        self._remote_committed: set[int] = set()
        self._per_host: bool | None = False  # ranks on hosts with disks of their own (set by the multi-rank managers)
        # A step restored from the remote store is read into memory only; True also writes it into local_dir (a
        # DDP job's rank 0, so that the node's other ranks read it from there: TorchJob.restore).
        self.keep_restored_copy = False
        self._step = 0
        self.last_error: str | None = None
        # Until one save reaches every store, a failed write or upload says the store cannot be written at all (no
        # credentials, no such bucket, a read-only directory): "STORE: error", which TrainingLoop stops the run on.
        # After that a failure may be passing, and training goes on (the next save tries again).
        self.store_error: str | None = None
        self._saved = False
        if install_signal_handler:
            self.install_notice_handler()
        self.status.update()

    @classmethod
    def from_env(cls, default_dir: str = "./respawn-checkpoints", **kwargs) -> "CheckpointManager":
        """Configure from the RESPAWN_* variables the node agent sets; without them, checkpoints go to
        `default_dir` so that the same script runs by hand."""
        env = os.environ
        uri = env.get(contract.ENV_CHECKPOINT_URI) or None
        local = env.get(contract.ENV_LOCAL_CHECKPOINT_DIR) or None
        if uri is None and local is None:
            local = os.path.abspath(default_dir)
        budget = env.get(contract.ENV_NOTICE_BUDGET)
        attempt = env.get(contract.ENV_ATTEMPT)
        kwargs.setdefault("notice_budget_s", float(budget) if budget else None)
        # One status file per node: in a multi-rank job only the node's first rank (LOCAL_RANK as torchrun sets it)
        # writes it; the other ranks on the node never touch it. Every rank learns the job's save outcomes.
        status_file = env.get(contract.ENV_STATUS_FILE) if env.get("LOCAL_RANK", env.get("RANK", "0")) == "0" else None
        kwargs.setdefault("status_file", status_file or None)
        kwargs.setdefault("job_id", env.get(contract.ENV_JOB_ID) or None)
        kwargs.setdefault("attempt", int(attempt) if attempt and attempt.isdigit() else None)
        return cls(uri, local, **kwargs)

    # ---- the notice -------------------------------------------------------------------------------------------

    def install_notice_handler(self, signals=(signal.SIGTERM,)) -> dict | None:
        """SIGTERM only sets a flag; the loop acts on it at the next step boundary. Main thread only. Returns the
        previous handlers {signal: handler}, or None when not in the main thread (nothing installed: deliver the
        notice with request_preemption()). Registers this process as one that saves (notice.py)."""
        return self._notice.install(signals)

    def request_preemption(self, reason: str = "requested", notice_at: float | None = None) -> None:
        """The in-process way to deliver the notice (what the SIGTERM handler does). notice_at is a
        time.monotonic() value; the deadline is notice_at + notice_budget_s."""
        self._notice.request(reason, notice_at)

    def clear_preemption(self) -> None:
        """Forget a notice (e.g. a maintenance event that passed without stopping the VM)."""
        self._notice.clear()

    @property
    def notice_at(self) -> float | None:
        """When the notice came (time.monotonic()), or None."""
        return self._notice.at

    @property
    def notice_budget_s(self) -> float:
        return self._notice.budget_s

    @property
    def preemption_requested(self) -> bool:
        return self._notice.requested(self._step)

    def deadline(self) -> float:
        """The emergency save's deadline (time.monotonic())."""
        return self._notice.deadline()

    # ---- progress ---------------------------------------------------------------------------------------------

    def report_step(self, step: int) -> None:
        """Call once per step (a restore may report its step too); the status file is rewritten at most a few times
        per second, and at once for the first step past the restored one, which it records with its time
        (TrainerStatus.first_step_at: a recovery ends there)."""
        self._step = step
        state = self.status.state
        if state["first_step"] is None and step > (state["committed_step"] or 0):
            self.status.update(step=step, first_step=step, first_step_at=time.time())
            return
        self.status.update(force=False, step=step)

    def _committed(self, step: int, kind: str, durable: str) -> None:
        current = self.status.snapshot()
        if current["committed_step"] is None or step >= current["committed_step"]:
            self.status.update(committed_step=step, committed_kind=kind, committed_durable=durable)

    # ---- saving ---------------------------------------------------------------------------------------------

    def prepare_snapshot(self, state: Any) -> None:
        """Optional: allocate and pre-fault the periodic-snapshot buffers on a background thread (call once after
        restore), so that the first periodic save stalls no longer than the later ones."""
        payload = flatten(state, copy=False)
        self._prepare_thread = threading.Thread(target=self._buffers.prepare, args=(payload.arrays,),
                                                name="respawn-prepare", daemon=True)
        self._prepare_thread.start()

    def _flatten(self, state: Any, copy: bool):
        """The payload a save writes (copy=True: a snapshot into the reused buffers; copy=False: the live arrays).
        A subclass with another layout (respawn.ckpt.jax_distributed) splits the state its own way."""
        return flatten(state, copy=copy, buffers=self._buffers if copy else None)

    def _is_committed(self, step: int) -> bool:
        """Whether `step` is committed already, locally or in the remote store, so that a save of it writes nothing
        (never rewrites a committed step: a step restored from the remote store has no local copy)."""
        return bool(self.local.steps().get(step)) or step in self._remote_committed

    def save(self, step: int, state: Any, *, blocking: bool = False, kind: str = "periodic") -> SaveOutcome | None:
        """Periodic checkpoint. The caller blocks only for the in-memory snapshot (plus the previous save if it
        has not finished: snapshot buffers are reused); writing, committing, uploading and retention run on a
        background thread, and wait() returns the outcome. blocking=True waits for all of it (e.g. the final
        checkpoint) and returns the outcome; otherwise save returns None."""
        if self._inflight is not None and self._inflight["thread"].is_alive():
            _log.warning("previous checkpoint still being written; waiting for it (checkpoint less often?)",
                         step=step, previous=self._inflight["step"])
        self.wait()
        self._step = max(self._step, step)
        if self._is_committed(step):  # already committed (e.g. resumed exactly here)
            durable = "remote" if self.remote is None or step in self._remote_committed else "local"
            return SaveOutcome(SaveState.COMMITTED, step, durable) if blocking else None
        self._join_prepare()
        payload = self._flatten(state, copy=True)
        cancel = threading.Event()
        job = {"step": step, "cancel": cancel, "result": None}

        def run():
            job["result"] = self._write_and_ship(step, kind, payload, fmt.WriteControl(cancel=cancel), retention=True)

        job["thread"] = threading.Thread(target=run, name=f"respawn-save-{step}", daemon=True)
        self._inflight = job
        job["thread"].start()
        return self.wait() if blocking else None

    def wait(self, timeout: float | None = None) -> SaveOutcome | None:
        """Wait for the in-flight periodic save; returns its outcome (None if there was none, or if it is still
        running after `timeout`)."""
        job = self._inflight
        if job is None:
            return None
        job["thread"].join(timeout)
        if not job["thread"].is_alive():
            self._inflight = None
        return job["result"]

    def _write_and_ship(self, step, kind, payload, control, retention) -> SaveOutcome:
        """Commit locally, then copy to the remote store."""
        durable_here = "remote" if self.remote is None else "local"
        started = time.monotonic()
        try:
            manifest = fmt.write_checkpoint(self.local.root, step, kind, payload, durable=durable_here,
                                            control=control, shard_bytes=self.shard_bytes,
                                            extra={"job_id": self.job_id, "attempt": self.attempt})
        except fmt.Abandoned as exc:
            _log.warning("checkpoint abandoned; the previous committed checkpoint stays the newest",
                         step=step, kind=kind, reason=str(exc))
            return SaveOutcome(SaveState.ABANDONED, step, reason=str(exc))
        except Exception as exc:  # noqa: BLE001 - a failed save must not kill training; it is reported
            self.last_error = f"{type(exc).__name__}: {exc}"
            _log.error("checkpoint failed (if this is an OSError: check space and permissions of the local checkpoint dir)",
                       step=step, kind=kind, dir=self.local.root, error=self.last_error)
            self._store_failed(self.local.uri, self.last_error)
            return SaveOutcome(SaveState.FAILED, step, reason=self.last_error)
        self._kinds[(self.local.uri, step)] = kind
        self._saved = self._saved or self.remote is None
        local_s = time.monotonic() - started
        self._committed(step, kind, durable_here)
        _log.info("checkpoint committed", step=step, kind=kind, durable=durable_here, bytes=manifest["total_bytes"],
                  seconds=round(local_s, 3), dir=self.local.step_dir(step))
        durable, reason = durable_here, None
        if self.remote is not None:
            durable, reason = self._ship(step, kind, manifest, control)
        outcome = SaveOutcome(SaveState.COMMITTED, step, durable, reason, round(time.monotonic() - started, 3),
                              manifest["total_bytes"])
        if retention:
            self.apply_retention(protect={step})
        return outcome

    def _ship(self, step: int, kind: str, manifest: dict, control) -> tuple[str, str | None]:
        """Upload a locally committed step; returns (durable, reason)."""
        try:
            self.remote.put_step(self.local.step_dir(step), step, manifest, control)
        except fmt.Abandoned as exc:
            _log.warning("upload abandoned; the checkpoint is durable on local disk only "
                         "(respawn.ckpt.upload_pending uploads it after a restart in place)",
                         step=step, remote=self.remote.uri, reason=str(exc))
            return "local", f"upload: {exc}"
        except Exception as exc:  # noqa: BLE001 - a failed upload keeps the local copy; it is reported
            self.last_error = f"{type(exc).__name__}: {exc}"
            _log.error("upload failed; the checkpoint is durable on local disk only; check the bucket and "
                       "credentials (respawn.ckpt.upload_pending retries later)", step=step, remote=self.remote.uri,
                       error=self.last_error)
            self._store_failed(self.remote.uri, self.last_error)
            return "local", f"upload: {self.last_error}"
        self._remote_committed.add(step)
        self._saved = True
        self._kinds[(self.remote.uri, step)] = kind
        self._committed(step, kind, "remote")
        _log.info("checkpoint uploaded", step=step, kind=kind, remote=self.remote.uri)
        return "remote", None

    def _store_failed(self, store: str, error: str) -> None:
        if not self._saved and self.store_error is None:
            self.store_error = f"{store}: {error}"

    def where(self) -> str:
        """The checkpoint folder in use, as a person reads it: the local directory, and the remote store if any."""
        return self.local.root + (f" (remote: {self.remote.uri})" if self.remote is not None else "")

    def discard_checkpoints(self) -> list[str]:
        """Delete every step, committed or not, in the local directory and the remote store: a fresh start
        (TrainingLoop with RESPAWN_FRESH=1). Returns "STORE#STEP" for each step removed."""
        removed = []
        for store in [self.local] + ([self.remote] if self.remote is not None else []):
            for step in sorted(store.steps()):
                store.delete_step(step)
                removed.append(f"{store.uri}#{step}")
        self._remote_committed.clear()
        return removed

    def emergency_save(self, step: int, state: Any) -> SaveOutcome:
        """Save `state` as step `step` within the notice deadline. Returns the outcome and records it in the
        status file (`emergency`) and the log."""
        deadline = self.deadline()
        self._step = max(self._step, step)
        if threading.current_thread() is threading.main_thread():
            ignore_children()  # for a notice given by request_preemption()
        self.status.update(step=step, emergency={"state": "saving", "step": step})
        _log.info("emergency checkpoint started", step=step, seconds_left=round(deadline - time.monotonic(), 3))
        started = time.monotonic()
        job = self._inflight
        if job is not None and job["thread"].is_alive():
            if job["step"] != step:
                # An older step may still commit, and is then what a restart finds if this save does not finish in
                # time: it gets half the time left, then is cancelled to free the disk and the cores for this one.
                job["thread"].join(max(0.0, (deadline - time.monotonic()) / 2))
                job["cancel"].set()
            job["thread"].join(max(0.0, deadline - time.monotonic()))  # this very step: let it finish in time
        control = fmt.WriteControl(deadline=deadline)
        if self._is_committed(step):  # committed already (the periodic save of this step, or a resume here)
            if self.remote is None or step in self._remote_committed:
                outcome = SaveOutcome(SaveState.COMMITTED, step, "remote")
            else:
                try:
                    manifest = fmt.read_manifest(self.local.step_dir(step))
                    outcome = SaveOutcome(SaveState.COMMITTED, step,
                                          *self._ship(step, manifest["kind"], manifest, control))
                except fmt.CorruptCheckpoint as exc:
                    outcome = SaveOutcome(SaveState.FAILED, step, reason=str(exc))
        else:
            try:
                payload = self._flatten(state, copy=False)
            except Exception as exc:  # noqa: BLE001 - reported in the outcome
                outcome = SaveOutcome(SaveState.FAILED, step,
                                      reason=f"cannot serialize state: {type(exc).__name__}: {exc}")
            else:
                outcome = self._write_and_ship(step, "emergency", payload, control, retention=False)
        outcome = replace(outcome, seconds=round(time.monotonic() - started, 3))
        self.status.update(emergency={"state": outcome.state.value, "step": step, "reason": outcome.reason})
        self._notice.register(outcome)
        log = _log.info if outcome.committed else _log.error
        log(f"emergency checkpoint {outcome.state.value}", **asdict(outcome),
            newest_committed=self.status.snapshot()["committed_step"])
        return outcome

    def note_outcome(self, outcome: SaveOutcome, kind: str) -> None:
        """Record in the status file a save another rank made for the job (a rank that does not write)."""
        if outcome.committed:
            self._committed(outcome.step, kind, outcome.durable)
        if kind == "emergency":
            self.status.update(emergency={"state": outcome.state.value, "step": outcome.step,
                                          "reason": outcome.reason})
            self._notice.register(outcome)

    def exit_preempted(self) -> None:
        """Leave the process after an emergency save: SystemExit(PREEMPTED_EXIT_CODE) when it committed, else
        SystemExit(contract.EXIT_NOTICE_UNSAVED) (neither is 0: not finished)."""
        self.status.flush()
        sys.stdout.flush()
        sys.exit(contract.exit_on_notice(self.status.snapshot()["emergency"]["state"] == "committed"))

    def finish(self, step: int) -> None:
        """Record the final step and wait for pending saves and threads; call before a successful exit (code 0)."""
        self.wait()
        self._join_prepare()
        self.status.update(step=step)

    # ---- restore --------------------------------------------------------------------------------------------

    def restore(self, step: int | None = None, like: Any = None) -> tuple[int, Any] | None:
        """(step, state) of the highest committed step whose checksums verify, looking at the local dir and
        the remote store; falls back step by step past torn or corrupt ones. None if there is none.
        step: that step only (a multi-rank job restores on every rank the step its rank 0 restored).
        like: the live state this one replaces (TrainingLoop passes its objects' state_dict()s): the saved arrays
        are read into its tensors and arrays where place, dtype and shape match (fmt.load_from), sparing a second
        copy of the state in memory. A step that fails its checksums may have overwritten some of them; the
        search then reads an older step into them, or raises NotRestorable."""
        started = time.monotonic()
        peers = peer_reads.from_env() if self.remote is not None else []

        def load(store, s: int) -> tuple[dict, Any, str]:  # one read of the bytes, checksums checked as they arrive
            copy_to = self.local.root if self.keep_restored_copy else None

            def check(manifest: dict) -> None:
                fmt.check_layout(manifest, s, None)

            # A step committed in the store whose bytes a survivor holds: from the survivor, else from the store.
            got = peer_reads.load(peers, store, s, copy_to, check, like) if store is self.remote else None
            return got or (*store.load_step(s, copy_to, check=check, like=like), store.uri)

        for s, store, (manifest, state, source) in self._verified_steps(load, only=step):
            self._restored(s, manifest, store=store.uri, source=source, seconds=round(time.monotonic() - started, 3))
            return s, state
        return None

    def _verified_steps(self, open_step: Callable[[Any, int], Any], only: int | None = None) -> Iterator[tuple]:
        """The one search for the newest verified step, which every manager's restore runs (restore.py:
        verified_steps); the remote store's committed steps, as listed, are remembered as its own."""
        started = time.monotonic()
        local, remote = restore.committed_steps(self.local, self.remote)
        self._remote_committed = set(remote)
        yield from restore.verified_steps(self.local, self.remote, (local, remote), open_step, only, started)

    def _restored(self, step: int, manifest: dict, **fields: Any) -> None:
        """Record a restored step: this life starts there (status file and log)."""
        durable = "remote" if self.remote is None or step in self._remote_committed else "local"
        self._step = step
        self.status.update(step=step, committed_step=step, committed_kind=manifest["kind"], committed_durable=durable)
        _log.info("restored checkpoint", step=step, kind=manifest["kind"], durable=durable,
                  framework=manifest["framework"], bytes=manifest["total_bytes"], **fields)

    # ---- retention ------------------------------------------------------------------------------------------

    def apply_retention(self, protect: set[int] = frozenset()) -> list[tuple[str, int]]:
        """Delete old committed checkpoints and uncommitted leftovers (retention.plan_retention) in both stores,
        never the step an unfinished save writes. Local copies that are newer than everything committed remotely are
        kept (not uploaded yet)."""
        protect = set(protect)
        job = self._inflight
        if job is not None and job["thread"].is_alive() and job["thread"] is not threading.current_thread():
            protect.add(job["step"])
        return retention.apply(self.local, self.remote, self._remote_committed, self.keep, protect, self._kinds)

    def close(self) -> None:
        self.wait()
        self._join_prepare()
        self.status.flush()

    def _join_prepare(self) -> None:
        """The snapshot buffers are ready, and no thread of ours runs when the interpreter finalizes (why:
        respawn.ckpt.distributed.release_group)."""
        if self._prepare_thread is not None:
            self._prepare_thread.join()
            self._prepare_thread = None


class ShardedManager(CheckpointManager):
    """A CheckpointManager for one member of a job whose members all write (one per member: every member calls
    save, emergency_save and restore, in the same order). The notice, the deadline, the asynchronous periodic saves
    and the status file work as for one process; the members' vote commits each step (respawn.ckpt.commit: member 0
    seals it; a job of one member is the single writer), and member 0 alone uploads a shared directory's step and
    applies retention. A checkpoint layout is a subclass: it names its layout and implements, for one member:
    _write_files(step, payload, control) -> its vote: its part durable, with `files` {name: {size, checksum}} (on
        hosts with disks of their own, uploaded next) and what _manifest_extra(votes) reads, which returns the
        layout's manifest fields (raising when the votes do not add up);
    _open_for_restore(store, step) -> (member 0) the step's directory, checked enough to offer it to every member;
    _load_part(step, step_dir, like) -> (manifest, this member's state) of the step member 0 offered."""

    layout = framework = members = ""  # the manifest's layout and framework; what the members are ("ranks")

    def __init__(self, *args: Any, seam: Seam, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seam, self._rank = seam, seam.rank
        self._commit = commit.of_members(seam)
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

    # ---- the commit: this member's part is its vote ----------------------------------------------------------

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
        outcome, manifest = self._commit.commit(step, vote, control,
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
        commit.fsync_dir(step_dir)  # every member's files are fsync'd; their names now too
        data = commit.manifest_bytes(manifest)
        commit.seal_dir(step_dir, step, data, commit.marker_bytes(step, data, manifest["checksum_algorithm"]), control)

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
                    raise restore.unrestorable(failed, self.local.uri, self.remote.uri if self.remote else None)
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


def prefetch(local_dir: str, checkpoint_uri: str) -> int | None:
    """Copy the newest step committed in `checkpoint_uri` into `local_dir` (every file checked as it arrives, the
    marker last), unless `local_dir` holds it committed already. The node agent runs it while setup runs, so that the
    trainer's restore, which takes the local copy first, reads it at the disk's speed. Only the single-writer format
    (one process or DDP): a sharded step's files belong to several hosts. Returns the step copied, or None."""
    local, remote = LocalStore(local_dir), open_store(checkpoint_uri)
    if isinstance(remote, LocalStore):  # file://: already on a disk the trainer reads
        return None
    newest = max((s for s, committed in remote.steps().items() if committed), default=None)
    if newest is None or local.steps().get(newest):
        return None
    try:
        if remote.committed_manifest(newest)[2].get("layout") is not None:
            return None
        remote.get_step(newest, local.root)
    except fmt.CorruptCheckpoint as exc:
        local.delete_step(newest)
        _log.warning("prefetch of the newest checkpoint failed; the trainer reads the store", step=newest,
                     reason=str(exc))
        return None
    return newest


def upload_pending(local_dir: str, checkpoint_uri: str) -> list[int]:
    """Upload committed checkpoints that exist only in `local_dir` (left by a previous life of this node) to
    `checkpoint_uri`. Only steps newer than the newest remote committed step are uploaded (older ones would
    never be restored). Each is verified before upload; corrupt ones are skipped with a warning. Returns the
    uploaded steps, ascending."""
    local = LocalStore(local_dir)
    remote = open_store(checkpoint_uri)
    if isinstance(remote, LocalStore) and remote.root == local.root:
        return []
    remote_committed = {s for s, c in remote.steps().items() if c}
    newest_remote = max(remote_committed, default=-1)
    uploaded = []
    for step in sorted(s for s, c in local.steps().items() if c and s > newest_remote):
        try:
            manifest = fmt.verify(local.step_dir(step))
        except fmt.CorruptCheckpoint as exc:
            _log.warning("local checkpoint is corrupt; not uploading it", step=step, dir=local.step_dir(step),
                         reason=str(exc))
            continue
        remote.put_step(local.step_dir(step), step, manifest)
        uploaded.append(step)
        _log.info("uploaded pending local checkpoint", step=step, kind=manifest["kind"], remote=remote.uri)
    return uploaded
