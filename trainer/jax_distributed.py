"""Multi-process JAX (jax.distributed initialized, one process per host, process_count() > 1) in TrainingLoop.

- Notice agreement, off the training path (as jax's own preemption sync point): a process that sees a notice
  announces it in the coordination service's key-value store; every process, as soon as it learns of it (a
  watcher thread), publishes the last step boundary it passed, and all stop after the largest published boundary
  + 1. Per step the loop pays a lock and a flag check, no collective.
- Sharded save: every process writes the shards of the global arrays it addresses (replica_id 0 only, so
  replicated data is written once) plus its own host state (the pickled rest of the state: data position, RNGs)
  into flat files of the step directory, fsyncs them and reports their sizes and checksums through the
  coordination service's key-value store; process 0 writes the manifest and the COMMITTED marker once every
  process has reported, then publishes the outcome every process returns.
- Restore: process 0 picks the step, every process reads the shards its devices need (checksums checked on the
  files it reads) into arrays of the saved mesh and sharding, and all agree that every process succeeded.

Hosts with disks of their own (respawn.ckpt.hosts tells, on the restore): every process uploads its files to the
remote store itself and process 0 writes the manifest and the marker there, so a step is committed only when every
process's files are in the remote store; on restore every process downloads just the files its shards need.
Processes that share a directory (one machine, a shared filesystem) commit there and process 0 uploads the step.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from respawn import contract

from . import _log, checksum, format as fmt, hosts
from .manager import CheckpointManager, SaveOutcome, SaveState
from .status import StatusWriter
from .serialize import ArrayRef, _map_tree, _np_dtype, unflatten

LAYOUT = "jax-sharded"
_POLL_S = 0.2  # how often a wait on the key-value store looks at the deadline, the cancel flag, the loop's end
_NOTICE = "respawn/notice"


def current_job() -> "JaxJob | None":
    """The job this process belongs to, or None (jax.distributed not initialized, or one process)."""
    if not jax.distributed.is_initialized() or jax.process_count() < 2:
        return None
    return JaxJob()


def _client():
    # The coordination service client jax.distributed.initialize connected (what multihost_utils uses too).
    from jax._src import distributed

    return distributed.global_state.client


def _files(pid: int) -> tuple[str, str]:
    return f"p{pid:05d}.bin", f"p{pid:05d}.pkl"


class JaxJob:
    """This process's side of the protocol. Every process must make the same calls in the same order."""

    writer = True  # every process writes its own shards; process 0 alone commits

    def __init__(self) -> None:
        self.rank, self.world_size = jax.process_index(), jax.process_count()
        self._agreement: _NoticeAgreement | None = None
        devices = [min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
                   for p in range(self.world_size)]
        mesh = Mesh(np.array(devices), ("process",))
        self._in = NamedSharding(mesh, PartitionSpec("process"))
        self._max = jax.jit(lambda x: x.max(), out_shardings=NamedSharding(mesh, PartitionSpec()))

    def default_manager(self, total_steps: int) -> CheckpointManager:
        return ShardedCheckpointManager.from_env(total_steps=total_steps)

    def check_replicated(self, objects: dict[str, Any]) -> None:
        """Host objects restored in place are per-process state, saved by each process for itself."""

    def all_max(self, value: int) -> int:
        """The largest `value` over all processes (a collective)."""
        # make_array_from_callback measured several times faster here than device_put + assembling the array.
        mine = jax.make_array_from_callback((self.world_size,), self._in, lambda index: np.array([value], np.int32))
        return int(self._max(mine).addressable_data(0))

    def agree_notice(self, manager: CheckpointManager) -> bool:
        """Whether every process stops at this step boundary (then every manager holds the notice's time)."""
        if self._agreement is None:
            self._agreement = _NoticeAgreement(self.rank, self.world_size, manager)
        return self._agreement.at_boundary()

    def restore(self, manager: CheckpointManager) -> tuple[int, Any] | None:
        if not isinstance(manager, ShardedCheckpointManager):
            raise TypeError("a multi-process JAX job needs a respawn.ckpt.jax_distributed.ShardedCheckpointManager "
                            f"(got {type(manager).__name__}): every process writes its own shards")
        return manager.restore_all(self)

    def save_outcome(self, step: int, save: Callable[[], SaveOutcome | None], deadline: float | None) -> SaveOutcome:
        """Every process saves; the outcome each returns is process 0's commit (published to all)."""
        if self._agreement is not None:
            self._agreement.stop()  # the loop is over: no watcher left waiting on the service at exit
        return save() or SaveOutcome(SaveState.FAILED, step, reason="the save thread died")


class _NoticeAgreement:
    """Every process stops after the same step S, without a collective per step. A process that sees a notice
    at boundary b announces it (its age: monotonic clocks differ between hosts) and publishes b; every other
    process's watcher thread wakes on the announcement and publishes the last boundary its loop passed (under the
    loop's lock, so the two agree). A process waits, at the latest at the boundary after the one it published,
    until all have published, and S = the largest published boundary + 1: no process can be past S, and none waits
    on another's loop (watchers publish), so the wait ends within a key-value round trip. Boundaries count this
    life's calls (every process restored the same step)."""

    def __init__(self, rank: int, world_size: int, manager: CheckpointManager) -> None:
        self._client, self._rank, self._n, self._manager = _client(), rank, world_size, manager
        self._lock = threading.Lock()
        self._boundary = -1  # the last boundary the loop passed
        self._published = False
        self._stop_at: int | None = None
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="respawn-notice-watch", daemon=True)
        self._watcher.start()
        atexit.register(self.stop)  # also when the loop ends in an exception: no call in flight at shutdown

    def at_boundary(self) -> bool:
        with self._lock:
            self._boundary += 1
            if not self._published and self._manager.preemption_requested:
                self._announce()
            if not self._published:
                return False
            boundary = self._boundary
        if self._stop_at is None:
            self._stop_at = self._wait_for_stop(boundary)
        return boundary >= self._stop_at

    def _announce(self) -> None:
        age_ms = int((time.monotonic() - self._manager.notice_at) * 1000)
        try:
            self._client.key_value_set(_NOTICE, json.dumps({"process": self._rank, "age_ms": age_ms}))
        except Exception as exc:  # noqa: BLE001 - another process announced first: its notice stands
            if "ALREADY_EXISTS" not in str(exc):
                raise
        self._publish()

    def _publish(self) -> None:
        self._client.key_value_set(f"{_NOTICE}/boundary/p{self._rank}", str(self._boundary))
        self._published = True

    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                notice = json.loads(self._client.blocking_key_value_get(_NOTICE, int(_POLL_S * 1000)))
            except Exception as exc:  # noqa: BLE001 - a timeout: look again; anything else: the service is gone
                if "DEADLINE_EXCEEDED" in str(exc):
                    continue
                return
            with self._lock:
                if not self._published:
                    self._manager.request_preemption(f"notice seen by process {notice['process']}",
                                                     notice_at=time.monotonic() - notice["age_ms"] / 1000)
                    _log.warning("preemption notice seen by another process; emergency checkpoint after the agreed "
                                 "step", process=self._rank, seen_by=notice["process"],
                                 seconds_since_notice=notice["age_ms"] / 1000)
                    self._publish()
            return

    def _wait_for_stop(self, boundary: int) -> int:
        control = fmt.WriteControl(deadline=self._manager.deadline())
        try:
            return 1 + max(int(_wait_key(self._client, f"{_NOTICE}/boundary/p{p}", control)) for p in range(self._n))
        except fmt.Abandoned as exc:
            _log.error("not every process answered the notice in time; stopping here", boundary=boundary,
                       error=str(exc))
            return boundary

    def stop(self) -> None:
        self._done.set()
        self._watcher.join(_POLL_S * 2)


# ---- the state: global arrays (sharded) and this process's host state (pickled) ----------------------------


@dataclass
class ShardedPayload:
    """A state split for one process: its skeleton (pickled, global arrays replaced by ArrayRef) and, per global
    array, its metadata and the host copies of the shards this process writes."""

    skeleton: bytes
    arrays: list[dict]  # {kind, dtype, shape, sharding, impl?}
    shards: list[list[tuple[list, np.ndarray]]]  # per array: [(index [[start, stop], ...], host data)]
    nbytes: int


class _HostKey:
    """A process-local typed PRNG key in the skeleton: its key data, wrapped again when unpickled."""

    def __init__(self, data: np.ndarray, impl: str) -> None:
        self.data, self.impl = data, impl

    def __reduce__(self):
        return _wrap_key, (self.data, self.impl)


def _wrap_key(data, impl):
    return jax.random.wrap_key_data(data, impl=impl)


def _sharding_meta(name: str, sharding) -> dict:
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"{name}: only NamedSharding global arrays are checkpointed across processes, "
                        f"got {type(sharding).__name__} (pass out_shardings=NamedSharding(...) to jit)")
    spec = [list(e) if isinstance(e, tuple) else e for e in sharding.spec]
    return {"mesh": np.asarray(sharding.mesh.device_ids).tolist(), "axes": list(sharding.mesh.axis_names),
            "spec": spec}


def _sharding(meta: dict) -> NamedSharding:
    by_id = {d.id: d for d in jax.devices()}
    ids = np.asarray(meta["mesh"])
    missing = sorted(set(ids.ravel().tolist()) - set(by_id))
    if missing:
        raise fmt.CorruptCheckpoint(f"the checkpoint's mesh has devices {missing} this job does not have: restore "
                                    "into the same mesh (same process count and devices per process)")
    mesh = Mesh(np.vectorize(by_id.__getitem__, otypes=[object])(ids), tuple(meta["axes"]))
    return NamedSharding(mesh, PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in meta["spec"]]))


def _index(index: tuple, shape: tuple) -> list:
    return [list(s.indices(n)[:2]) for s, n in zip(index, shape)]


def split_state(state: Any, copy: bool) -> ShardedPayload:
    """copy=True: host copies of the shards (periodic saves; the loop goes on and may donate the buffers);
    copy=False: views where the backend allows (the emergency save: the loop is stopped)."""
    arrays, shards = [], []
    nbytes = 0

    def take(x):
        nonlocal nbytes
        if not isinstance(x, jax.Array):
            return None  # pickled into the skeleton below, which is itself a snapshot
        key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        data = jax.random.key_data(x) if key else x
        if data.is_fully_addressable:  # a process-local array: host state of this process
            host = np.array(data)
            return _HostKey(host, str(jax.random.key_impl(x))) if key else host
        meta = {"kind": "jax_key" if key else "jax", "dtype": np.dtype(data.dtype).name, "shape": list(data.shape),
                "sharding": _sharding_meta(f"array {len(arrays)}", data.sharding)}
        if key:
            meta["impl"] = str(jax.random.key_impl(x))
        mine = []
        for shard in data.addressable_shards:
            if shard.replica_id == 0:  # replicated data: written once, by the owner of replica 0
                host = np.array(shard.data) if copy else np.asarray(shard.data)
                mine.append((_index(shard.index, data.shape), host))
                nbytes += host.nbytes
        arrays.append(meta)
        shards.append(mine)
        return ArrayRef(len(arrays) - 1)

    skeleton = _map_tree(state, take)
    return ShardedPayload(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), arrays, shards, nbytes)


# ---- the manager ----------------------------------------------------------------------------------------------


class ShardedCheckpointManager(CheckpointManager):
    """A CheckpointManager for one process of a multi-process JAX job (one per process). The notice, the deadline,
    the asynchronous periodic saves, retention and the status file work as for one process; the write commits
    one step for the whole job and restore reads only this process's shards. Only process 0 gets the status file
    (from_env), uploads to the remote store and applies retention."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._per_host: bool | None = None  # known after the first collective (restore_all)
        self._own_status_file: str | None = None
        self._exchanges = itertools.count()

    @classmethod
    def from_env(cls, default_dir: str = "./respawn-checkpoints", **kwargs) -> "ShardedCheckpointManager":
        path = os.environ.get(contract.ENV_STATUS_FILE) or None
        if jax.process_index() != 0:
            kwargs["status_file"] = None  # processes sharing a node: one status file, the committing process's
        manager = super().from_env(default_dir, **kwargs)
        manager._own_status_file = path  # for a process alone on its host (_find_hosts)
        return manager

    def _find_hosts(self) -> None:
        """Whether the processes have checkpoint directories of their own (hosts with their own disks), and
        what follows: every process uploads and a remote store is required; each host's process keeps the
        node's status file. Otherwise process 0 alone uploads the committed step."""
        pid, n, client = jax.process_index(), jax.process_count(), _client()

        def exchange(data: bytes) -> list[bytes]:
            key = f"respawn/hosts/{next(self._exchanges)}"
            client.key_value_set(f"{key}/{pid}", data.decode())
            return [client.blocking_key_value_get(f"{key}/{p}", 600_000).encode() for p in range(n)]

        groups = hosts.shared_groups(self.local.root, pid, exchange)
        self._per_host = hosts.per_host(groups, self.remote is not None, "processes")
        if not self._per_host and pid != 0:
            self.remote = None  # process 0 uploads each committed step (the directory is shared), no one else
        if self._per_host and pid != 0 and self._own_status_file and self.status.path is None:
            self.status = StatusWriter(self._own_status_file, self.status.snapshot()["total_steps"])
            self.status.update()

    def _flatten(self, state: Any, copy: bool) -> ShardedPayload:
        return split_state(state, copy)

    def prepare_snapshot(self, state: Any) -> None:
        """Nothing to pre-allocate: the shards' host copies are new arrays per save."""

    def _write_and_ship(self, step, kind, payload: ShardedPayload, control, retention) -> SaveOutcome:
        started = time.monotonic()
        pid, n = jax.process_index(), jax.process_count()
        client, prefix = _client(), f"respawn/ckpt/{step}"
        step_dir = self.local.step_dir(step)
        try:
            if self._per_host is None:  # a save before any restore: find out now (every process's first save)
                self._find_hosts()
            if self._per_host and pid == 0:
                # A leftover of an earlier attempt at this step goes (marker first) before any process uploads;
                # the others wait for the word, which comes even if the delete failed (then this save fails here).
                try:
                    self.remote.delete_step(step)
                finally:
                    client.key_value_set(f"{prefix}/clean", "1")
            report = {"ok": True, **_write_part(step_dir, pid, payload, control)}
            if self._per_host:
                if pid != 0:
                    _wait_key(client, f"{prefix}/clean", control)
                self.remote.put_files(step_dir, step, list(report["files"]), control)
        except Exception as exc:  # noqa: BLE001 - told to process 0, which then does not commit the step
            report = {"ok": False, "reason": f"process {pid}: {exc if isinstance(exc, fmt.Abandoned) else repr(exc)}"}
        client.key_value_set(f"{prefix}/p{pid}", json.dumps(report))
        if pid == 0:
            outcome = self._commit(step, kind, prefix, report, n, control)
            client.key_value_set(f"{prefix}/commit", json.dumps([outcome.state.value, outcome.durable, outcome.reason]))
        else:
            try:
                state, durable, reason = json.loads(_wait_key(client, f"{prefix}/commit", control))
                outcome = SaveOutcome(SaveState(state), step, durable, reason)
            except fmt.Abandoned as exc:
                outcome = SaveOutcome(SaveState.ABANDONED, step, reason=f"process 0's commit not received: {exc}")
            if self._per_host:
                if outcome.committed:
                    self._remote_committed.add(step)
                    self._committed(step, kind, outcome.durable)
                for old in [s for s in self.local.steps() if s <= step]:  # sent or useless: the remote decides
                    self.local.delete_step(old)
        outcome = SaveOutcome(outcome.state, step, outcome.durable, outcome.reason,
                              round(time.monotonic() - started, 3), payload.nbytes)
        if not outcome.committed:
            _log.warning("checkpoint not committed; the previous committed checkpoint stays the newest", step=step,
                         kind=kind, state=outcome.state.value, reason=outcome.reason)
        elif pid == 0 and retention:
            # Steps above this one may already hold other processes' parts of the next save: never delete them.
            self.apply_retention(protect={s for s in self.local.steps() if s >= step})
        return outcome

    def _commit(self, step, kind, prefix, report, n, control) -> SaveOutcome:
        """Process 0: wait for every process's report, then write the manifest and the marker."""
        client, reports = _client(), [report]
        try:
            for p in range(1, n):
                reports.append(json.loads(_wait_key(client, f"{prefix}/p{p}", control)))
            failed = [r["reason"] for r in reports if not r["ok"]]
            if failed:
                late = all("deadline" in r or "cancel" in r for r in failed)
                state = SaveState.ABANDONED if late else SaveState.FAILED
                return SaveOutcome(state, step, reason="; ".join(failed))
            control.check(f"committing step {step}")
            manifest = self._write_manifest(step, kind, reports)
        except fmt.Abandoned as exc:
            return SaveOutcome(SaveState.ABANDONED, step, reason=str(exc))
        except Exception as exc:  # noqa: BLE001 - reported in the outcome
            self.last_error = f"{type(exc).__name__}: {exc}"
            return SaveOutcome(SaveState.FAILED, step, reason=self.last_error)
        store = self.remote if self._per_host else self.local
        self._kinds[(store.uri, step)] = kind
        durable = "remote" if self.remote is None or self._per_host else "local"
        self._committed(step, kind, durable)
        _log.info("checkpoint committed", step=step, kind=kind, processes=n, bytes=manifest["total_bytes"],
                  store=store.uri)
        reason = None
        if self.remote is not None and not self._per_host:  # process 0 reads every file: the directory is shared
            durable, reason = self._ship(step, kind, manifest, control)
        return SaveOutcome(SaveState.COMMITTED, step, durable, reason)

    def _write_manifest(self, step: int, kind: str, reports: list[dict]) -> dict:
        arrays = [dict(meta, shards=[]) for meta in reports[0]["arrays"]]
        files: dict[str, dict] = {}
        for r in reports:
            files.update(r["files"])
            for i, part in enumerate(r["parts"]):
                arrays[i]["shards"].extend(part)
        manifest = {
            "format": fmt.FORMAT, "version": fmt.VERSION, "layout": LAYOUT, "processes": len(reports),
            "step": step, "kind": kind, "framework": "jax", "created_at": time.time(),
            "durable": "remote" if self.remote is None or self._per_host else "local",
            "checksum_algorithm": checksum.DEFAULT_ALGORITHM,
            "total_bytes": sum(f["size"] for f in files.values()), "files": dict(sorted(files.items())),
            "arrays": arrays, "job_id": self.job_id, "attempt": self.attempt,
        }
        if self._per_host:  # every process uploaded its files before it reported: commit where they are
            self.remote.commit_step(step, manifest)
            self._remote_committed.add(step)
            return manifest
        step_dir = self.local.step_dir(step)
        for name, want in files.items():  # what the others wrote must be here: one directory for the whole job
            path = os.path.join(step_dir, name)
            if not os.path.exists(path) or os.path.getsize(path) != want["size"]:
                raise fmt.CorruptCheckpoint(f"{name} is not in {step_dir} with {want['size']} bytes: every process "
                                            "must write into the same checkpoint directory (a shared filesystem)")
        data = json.dumps(manifest, indent=1).encode()
        fmt.write_file_durable(os.path.join(step_dir, fmt.MANIFEST), data)
        fmt.fsync_dir(step_dir)
        fmt.write_file_durable(os.path.join(step_dir, fmt.MARKER),
                               fmt.marker_bytes(step, data, checksum.DEFAULT_ALGORITHM))
        fmt.fsync_dir(step_dir)
        fmt.fsync_dir(self.local.root)
        return manifest

    def restore(self, step: int | None = None) -> tuple[int, Any] | None:
        raise TypeError("ShardedCheckpointManager restores through its job: TrainingLoop, or restore_all(JaxJob())")

    def restore_all(self, job: JaxJob) -> tuple[int, Any] | None:
        """(step, state) of the newest committed step that every process could read, or None. Process 0 picks
        each candidate (downloading it from the remote store if only there) and publishes its directory; all
        processes read their parts there and agree (a MAX of failure flags) before any returns it."""
        client, pid = _client(), job.rank
        started = time.monotonic()
        self._find_hosts()
        candidates = iter(self._candidates()) if pid == 0 else None
        for attempt in itertools.count():
            key = f"respawn/restore/{attempt}"
            if pid == 0:
                step, step_dir = next(candidates, (-1, None))
                client.key_value_set(key, json.dumps([step, step_dir]))
            else:
                step, step_dir = json.loads(client.blocking_key_value_get(key, 600_000))
            if step < 0:
                _log.info("no committed checkpoint found; starting from scratch", local=self.local.uri)
                return None
            try:
                if self._per_host and pid != 0:  # process 0's directory is on its host: fetch what this one reads
                    step_dir = self.remote.get_step(step, self.local.root, names=lambda m: _needed_files(m, pid))
                manifest = fmt.read_manifest(step_dir)
                state = _read_part(step_dir, pid, manifest)
                failed = 0
            except (fmt.CorruptCheckpoint, OSError, ValueError, EOFError) as exc:
                _log.warning("checkpoint unusable on this process; falling back to an older one", step=step,
                             process=pid, reason=f"{type(exc).__name__}: {exc}")
                failed = 1
            if job.all_max(failed):
                continue
            self._step = step
            if self._per_host:  # every process knows the same committed steps: this one, and those from here on
                self._remote_committed = {step}
            durable = "remote" if self.remote is None or step in self._remote_committed else "local"
            self.status.update(step=step, committed_step=step, committed_kind=manifest["kind"],
                               committed_durable=durable)
            _log.info("restored checkpoint", step=step, kind=manifest["kind"], processes=manifest["processes"],
                      dir=step_dir, durable=durable, seconds=round(time.monotonic() - started, 3))
            return step, state

    def _candidates(self):
        """Process 0: (step, directory) of the committed steps, newest first, local copy before remote (a remote
        step is downloaded into the local directory; a file:// store is read in place)."""
        local, remote = self._committed_steps()
        for step in sorted(local | remote, reverse=True):
            try:
                if step in local:
                    step_dir = self.local.step_dir(step)
                    fmt.verify(step_dir, data=False)
                elif self._per_host:  # only the files process 0 reads; the others fetch their own
                    step_dir = self.remote.get_step(step, self.local.root, names=lambda m: _needed_files(m, 0))
                    fmt.read_manifest(step_dir)
                else:
                    step_dir = self.remote.get_step(step, self.local.root)
                    fmt.verify(step_dir, data=False)
            except Exception as exc:  # noqa: BLE001 - the next older step may do
                _log.warning("checkpoint unusable; falling back to an older one", step=step, reason=str(exc))
                continue
            yield step, step_dir


def _wait_key(client, key: str, control: fmt.WriteControl) -> str:
    """A value from the key-value store, waiting in short slices so that the deadline and a cancel still stop it
    (raises fmt.Abandoned)."""
    while True:
        control.check(f"waiting for {key}")
        try:
            return client.blocking_key_value_get(key, int(_POLL_S * 1000))
        except Exception as exc:  # noqa: BLE001 - jax raises its runtime error on a timeout: look again
            if "DEADLINE_EXCEEDED" not in str(exc):
                raise


def _write_part(step_dir: str, pid: int, payload: ShardedPayload, control: fmt.WriteControl) -> dict:
    """This process's files, written and fsync'd; returns their sizes and checksums and where its shards are.
    Never removes the directory: the other processes write into it too."""
    data_name, tree_name = _files(pid)
    os.makedirs(step_dir, exist_ok=True)
    summer, offset = checksum.Checksum(), 0
    parts: list[list[dict]] = []
    try:
        with open(os.path.join(step_dir, data_name), "wb", buffering=0) as f:
            for shards in payload.shards:
                parts.append([])
                for index, host in shards:
                    view = memoryview(np.ascontiguousarray(host).reshape(-1).view(np.uint8))
                    for start in range(0, len(view), fmt.CHUNK):
                        control.check(f"writing process {pid}'s shards")
                        chunk = view[start:start + fmt.CHUNK]
                        summer.update(chunk)
                        f.write(chunk)
                    parts[-1].append({"index": index, "file": data_name, "offset": offset, "nbytes": len(view)})
                    offset += len(view)
            os.fsync(f.fileno())
        fmt.write_file_durable(os.path.join(step_dir, tree_name), payload.skeleton)
        fmt.fsync_dir(step_dir)
    except BaseException:
        for name in (data_name, tree_name):
            try:
                os.remove(os.path.join(step_dir, name))
            except FileNotFoundError:
                pass
        raise
    files = {data_name: {"size": offset, "checksum": summer.hexdigest()},
             tree_name: {"size": len(payload.skeleton), "checksum": checksum.of_bytes(payload.skeleton)}}
    return {"files": files, "arrays": payload.arrays, "parts": parts}


def _read_file(step_dir: str, name: str, manifest: dict) -> np.ndarray:
    want = manifest["files"].get(name)
    if want is None:
        raise fmt.CorruptCheckpoint(f"{name} is not in the manifest")
    data = np.fromfile(os.path.join(step_dir, name), dtype=np.uint8)
    got = checksum.of_bytes(memoryview(data), manifest["checksum_algorithm"])
    if data.nbytes != want["size"] or got != want["checksum"]:
        raise fmt.CorruptCheckpoint(f"{name}: {data.nbytes} bytes, checksum {got}; the manifest says "
                                    f"{want['size']} bytes, {want['checksum']}")
    return data


def _needed_files(manifest: dict, pid: int) -> list[str]:
    """The files process `pid` (this process) reads on restore: its host state and the data files holding the
    shards its devices address."""
    _check_layout(manifest)
    names = {_files(pid)[1]}
    for meta in manifest["arrays"]:
        shape = tuple(meta["shape"])
        by_index = {json.dumps(s["index"]): s["file"] for s in meta["shards"]}
        for index in _sharding(meta["sharding"]).addressable_devices_indices_map(shape).values():
            name = by_index.get(json.dumps(_index(index, shape)))
            if name is not None:  # a missing shard: _read_part names it
                names.add(name)
    return sorted(names)


def _check_layout(manifest: dict) -> None:
    if manifest.get("layout") != LAYOUT or manifest.get("processes") != jax.process_count():
        raise fmt.CorruptCheckpoint(f"written by {manifest.get('processes', 1)} process(es) in layout "
                                    f"{manifest.get('layout', 'single-process')}; this job has "
                                    f"{jax.process_count()} processes: restore into the same mesh")


def _read_part(step_dir: str, pid: int, manifest: dict) -> Any:
    """This process's view of the state: every global array with the saved sharding (the shards this process's
    devices hold, read from whichever process wrote them) and this process's own host state."""
    _check_layout(manifest)
    cache: dict[str, np.ndarray] = {}
    arrays = []
    for meta in manifest["arrays"]:
        shape, dtype = tuple(meta["shape"]), _np_dtype(meta["dtype"])
        by_index = {json.dumps(s["index"]): s for s in meta["shards"]}

        def shard(index, shape=shape, dtype=dtype, by_index=by_index):
            s = by_index.get(json.dumps(_index(index, shape)))
            if s is None:
                raise fmt.CorruptCheckpoint(f"no shard {_index(index, shape)} of an array of shape {shape}")
            if s["file"] not in cache:
                cache[s["file"]] = _read_file(step_dir, s["file"], manifest)
            raw = cache[s["file"]][s["offset"]:s["offset"] + s["nbytes"]]
            return raw.view(dtype).reshape([b - a for a, b in s["index"]])

        array = jax.make_array_from_callback(shape, _sharding(meta["sharding"]), shard)
        arrays.append(jax.random.wrap_key_data(array, impl=meta["impl"]) if meta["kind"] == "jax_key" else array)
    tree_name = _files(pid)[1]
    return unflatten(_read_file(step_dir, tree_name, manifest).tobytes(), arrays)
