"""Multi-process JAX (jax.distributed initialized, one process per host, process_count() > 1) in TrainingLoop: the
notice agreed off the training path through the coordination service's key-value store (_NoticeAgreement); every
process writes the shards of the global arrays it addresses (replica 0 only) and its own host state, and
respawn.ckpt.commit's two-phase commit runs over the same store (KeyValueSeam); on restore every process reads the
shards its devices need into arrays of the saved mesh and sharding. In full: docs/checkpoint.md ("Multi-process JAX
(jax.distributed)").
"""

from __future__ import annotations

import atexit
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

from . import _log, checksum, format as fmt
from .commit import Seam, fsync_dir, write_file_durable
from .jax_compat import coordination_client
from .manager import Manager, SaveOutcome, SaveState, ShardedManager
from .status import StatusWriter
from .serialize import ArrayRef, map_tree, np_dtype, unflatten

LAYOUT = "jax-sharded"
_POLL_S = 0.2  # how often a wait on the key-value store looks at the deadline, the cancel flag, the loop's end
_NOTICE = "respawn/notice"


def current_job() -> JaxJob | None:
    """The job this process belongs to, or None (jax.distributed not initialized, or one process)."""
    return JaxJob() if jax.distributed.is_initialized() and jax.process_count() > 1 else None


def _files(pid: int) -> tuple[str, str]:
    return f"p{pid:05d}.bin", f"p{pid:05d}.pkl"


class JaxJob:
    """This process's side of the protocol. Every process must make the same calls in the same order."""

    writer = True  # every process writes its own shards; process 0 alone commits

    def __init__(self) -> None:
        self.rank, self.world_size = jax.process_index(), jax.process_count()
        self._agreement: _NoticeAgreement | None = None

    def default_manager(self, total_steps: int) -> ShardedCheckpointManager:
        return ShardedCheckpointManager.from_env(total_steps=total_steps)

    def agree_notice(self, manager: Manager) -> bool:
        """Whether every process stops at this step boundary (then every manager holds the notice's time)."""
        if self._agreement is None:
            self._agreement = _NoticeAgreement(self.rank, self.world_size, manager)
        return self._agreement.at_boundary()

    def restore(self, manager: Manager, like: Any = None) -> tuple[int, Any] | None:
        """like: unused (JAX arrays are immutable: a restore makes new ones)."""
        if not isinstance(manager, ShardedCheckpointManager):
            raise TypeError("a multi-process JAX job needs a respawn.ckpt.jax_distributed.ShardedCheckpointManager "
                            f"(got {type(manager).__name__}): every process writes its own shards")
        return manager.restore()

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

    def __init__(self, rank: int, world_size: int, manager: Manager) -> None:
        self._client, self._rank, self._n, self._manager = coordination_client(), rank, world_size, manager
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

    def take(x):
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
        arrays.append(meta)
        shards.append(mine)
        return ArrayRef(len(arrays) - 1)

    skeleton = map_tree(state, take)
    return ShardedPayload(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), arrays, shards)


# ---- the manager ----------------------------------------------------------------------------------------------


class KeyValueSeam:
    """The commit's seam on the coordination service's key-value store (jax.distributed's): the checkpoint's
    exchanges never meet the training's collectives. Every exchange has keys of its own, named by `key`."""

    def __init__(self) -> None:
        self._client = coordination_client()
        self.rank, self.size = jax.process_index(), jax.process_count()

    def all_gather(self, key: str, data: bytes, control: fmt.WriteControl | None = None) -> list[bytes]:
        self._client.key_value_set(f"{key}/p{self.rank}", data.decode())
        return [self._get(f"{key}/p{p}", control).encode() for p in range(self.size)]

    def broadcast(self, key: str, data: bytes | None, control: fmt.WriteControl | None = None) -> bytes:
        if self.rank == 0:
            self._client.key_value_set(key, data.decode())
            return data
        return self._get(key, control).encode()

    def _get(self, key: str, control: fmt.WriteControl | None) -> str:
        return _wait_key(self._client, key, control) if control else self._client.blocking_key_value_get(key, 600_000)


class ShardedCheckpointManager(ShardedManager):
    """A CheckpointManager for one process of a multi-process JAX job (one per process). The notice, the deadline,
    the asynchronous periodic saves, retention and the status file work as for one process; the write commits
    one step for the whole job and restore reads only this process's shards. Only process 0 gets the status file
    (from_env), uploads to the remote store and applies retention."""

    layout, framework, members = LAYOUT, "jax", "processes"

    def __init__(self, *args: Any, seam: Seam | None = None, **kwargs: Any) -> None:
        super().__init__(*args, seam=seam or KeyValueSeam(), **kwargs)
        self._own_status_file: str | None = None

    @classmethod
    def from_env(cls, default_dir: str = "./respawn-checkpoints", **kwargs) -> "ShardedCheckpointManager":
        path = os.environ.get(contract.ENV_STATUS_FILE) or None
        if jax.process_index() != 0:
            kwargs["status_file"] = None  # processes sharing a node: one status file, the committing process's
        manager = super().from_env(default_dir, **kwargs)
        manager._own_status_file = path  # for a process alone on its host (_find_hosts)
        return manager

    def _find_hosts(self) -> None:
        """As for every sharded manager; a process alone on its host also keeps the node's status file."""
        super()._find_hosts()
        if self._per_host and self._rank != 0 and self._own_status_file and self.status.path is None:
            self.status = StatusWriter(self._own_status_file, self.status.snapshot()["total_steps"])
            self.status.update()

    def _flatten(self, state: Any, copy: bool) -> ShardedPayload:
        return split_state(state, copy)

    def prepare_snapshot(self, state: Any) -> None:
        """Nothing to pre-allocate: the shards' host copies are new arrays per save."""

    def _write_files(self, step: int, payload: ShardedPayload, control: fmt.WriteControl) -> dict:
        client, clean, step_dir = coordination_client(), f"respawn/ckpt/{step}/clean", self.local.step_dir(step)
        if self._per_host and self._rank == 0:
            # A leftover of an earlier attempt at this step goes (marker first) before any process uploads; the
            # others wait for the word, which comes even if the delete failed (then this save fails here).
            try:
                self.remote.delete_step(step)
            finally:
                client.key_value_set(clean, "1")
        part = _write_part(step_dir, self._rank, payload, control)
        if self._per_host and self._rank != 0:
            _wait_key(client, clean, control)  # process 0's delete first: this process uploads next
        return part

    def _manifest_extra(self, votes: list[dict]) -> dict:
        arrays = [dict(meta, shards=[]) for meta in votes[0]["arrays"]]
        for v in votes:
            for i, part in enumerate(v["parts"]):
                arrays[i]["shards"].extend(part)
        return {"processes": len(votes), "arrays": arrays}

    def _open_for_restore(self, store, step: int) -> str:
        """Process 0: the step's directory, local copy before remote (a remote step is downloaded into the local
        directory; a file:// store is read in place)."""
        if store is self.local:
            step_dir = self.local.step_dir(step)
            fmt.verify(step_dir, data=False)
        elif self._per_host:  # only the files process 0 reads; the others fetch their own
            step_dir = self.remote.get_step(step, self.local.root, names=lambda m: _needed_files(m, 0))
            fmt.read_manifest(step_dir)
        else:
            step_dir = self.remote.get_step(step, self.local.root)
            fmt.verify(step_dir, data=False)
        return step_dir

    def _load_part(self, step: int, step_dir: str, like: Any) -> tuple[dict, Any]:
        """Every process reads the shards its devices need (checksums checked on the files it reads) into arrays
        of the saved mesh and sharding, and its own host state; process 0's directory is on its host, so on hosts
        with disks of their own the others fetch what they read from the remote store."""
        if self._per_host and self._rank != 0:
            step_dir = self.remote.get_step(step, self.local.root, names=lambda m: _needed_files(m, self._rank))
        manifest = fmt.read_manifest(step_dir)
        return manifest, _read_part(step_dir, self._rank, manifest)


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
        write_file_durable(os.path.join(step_dir, tree_name), payload.skeleton)
        fsync_dir(step_dir)
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
        shape, dtype = tuple(meta["shape"]), np_dtype(meta["dtype"])
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
