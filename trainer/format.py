"""The on-disk checkpoint format (one for PyTorch and JAX).

    <root>/step_{step:012d}/
        data-00000.bin ...   raw array bytes, packed back to back; a large array spans several files
        tree.pkl             the pickled skeleton of the state (everything that is not an array)
        manifest.json        step, kind, framework, created_at, durable, files {name: {size, checksum}}, arrays
        COMMITTED            written last: {"step", "manifest_checksum"}; without it the directory does not exist

Every file and the directory are fsync'd before the marker is written, and the marker is fsync'd too (the store's
marker, respawn.ckpt.commit.seal_dir: how every step becomes final). A reader trusts a step only if the marker
exists, the manifest's checksum matches the marker, and every file has the size and checksum the manifest lists.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from respawn import contract

from . import checksum
from .commit import (  # Abandoned and WriteControl (how a save stops) are the commit's, named as the format's too
    Abandoned, WriteControl, manifest_bytes, marker_bytes, seal_dir, write_file_durable)
from .serialize import Payload

FORMAT = "respawn-checkpoint"
VERSION = 1
MARKER = contract.CHECKPOINT_MARKER  # the node agent serves committed steps to peers: the names are the contract's
MANIFEST = contract.CHECKPOINT_MANIFEST
SKELETON = "tree.pkl"
STEP_RE = contract.CHECKPOINT_STEP_RE
CHUNK = 8 << 20
DEFAULT_SHARD_BYTES = 256 << 20


STEP_DIR_PREFIX = "step_"  # every step directory's name starts so (STEP_RE); nothing else in a checkpoint root does


def step_dirname(step: int) -> str:
    return f"{STEP_DIR_PREFIX}{step:012d}"


def parse_step(name: str) -> int | None:
    m = STEP_RE.match(name.rstrip("/"))
    return int(m.group(1)) if m else None


class CorruptCheckpoint(Exception):
    """A step directory that must not be restored (torn, missing marker, bad checksum, unreadable)."""


class NotRestorable(RuntimeError):
    """Committed checkpoints exist but this job cannot restore them (written in another layout, or every one
    unusable). Restore raises it rather than start the job over at step 0 as if there were none."""


def check_layout(manifest: dict, step: int, want: str | None) -> None:
    """Raise NotRestorable unless the step was written in layout `want` (None: the single-process format).
    A layout is a kind of job, not damage: falling back to an older step (or to step 0) would lose the run."""
    got = manifest.get("layout")
    if got == want:
        return
    def describe(layout):
        return {None: "the single-process format (a job without DTensor parameters: one process, or DDP)",
                "torch-dcp": "torch DCP shards (a job whose model holds DTensor parameters: FSDP2)"}.get(
                    layout, f"layout {layout!r}")
    raise NotRestorable(f"the checkpoint of step {step} holds {describe(got)} (world size "
                        f"{manifest.get('world_size', manifest.get('processes', 1))}), but this job restores "
                        f"{describe(want)}: run it the way it was written (e.g. FSDP2 under torchrun, any number of "
                        "ranks), or move that checkpoint directory away to start from step 0")


def new_manifest(step: int, kind: str, framework: str, durable: str, files: dict[str, dict],
                 algorithm: str = checksum.DEFAULT_ALGORITHM, **extra) -> dict:
    """A step's manifest: what the marker's checksum covers and what a reader checks every file against."""
    return {"format": FORMAT, "version": VERSION, "step": step, "kind": kind, "framework": framework,
            "created_at": time.time(), "durable": durable, "checksum_algorithm": algorithm,
            "total_bytes": sum(f["size"] for f in files.values()), "files": dict(sorted(files.items())), **extra}


def write_checkpoint(root: str, step: int, kind: str, payload: Payload, *, durable: str = "local",
                     extra: dict | None = None, control: WriteControl | None = None,
                     shard_bytes: int = DEFAULT_SHARD_BYTES, algorithm: str = checksum.DEFAULT_ALGORITHM) -> dict:
    """Write and commit step_{step}/ under `root`. Returns the manifest. Raises Abandoned (the partial directory
    is removed) if the control stops it; any committed directory, including another step's, is left alone."""
    control = control or WriteControl()
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, step_dirname(step))
    if os.path.exists(os.path.join(final, MARKER)):
        raise FileExistsError(f"step {step} is already committed in {root}")
    if os.path.exists(final):
        shutil.rmtree(final)  # an uncommitted leftover of an earlier attempt at this step
    os.makedirs(final)
    # The writer thread only issues write()s; checksums and per-file fsyncs run on two helper threads (both
    # release the GIL), so the disk never waits for the CPU and the flush runs at disk speed.
    hash_ex = ThreadPoolExecutor(1, thread_name_prefix="respawn-crc")
    sync_ex = ThreadPoolExecutor(1, thread_name_prefix="respawn-fsync")
    futures: list = []
    shard_f = None
    try:
        control.check("starting")
        files: dict[str, dict] = {}
        entries: list[dict] = []
        written = 0
        shard_index, shard_sum, shard_size, shard_name = 0, None, 0, None

        def close_shard():
            nonlocal shard_f
            if shard_f is not None:
                f, name, size, summer = shard_f, shard_name, shard_size, shard_sum
                shard_f = None

                def record():
                    files[name] = {"size": size, "checksum": summer.hexdigest()}

                def sync():
                    try:
                        os.fsync(f.fileno())
                    finally:
                        f.close()

                futures.append(hash_ex.submit(record))
                futures.append(sync_ex.submit(sync))

        def open_shard():
            nonlocal shard_f, shard_sum, shard_size, shard_name, shard_index
            close_shard()
            shard_name = f"data-{shard_index:05d}.bin"
            shard_index += 1
            shard_f = open(os.path.join(final, shard_name), "wb", buffering=0)
            shard_sum, shard_size = checksum.Checksum(algorithm), 0

        open_shard()
        for item in payload.arrays:
            view = item.host_bytes()
            parts: list[dict] = []
            start = 0
            while start < len(view) or not parts:
                if shard_size >= shard_bytes:
                    open_shard()  # large arrays span several files: parallel transfers, bounded fsyncs
                n_part = min(len(view) - start, shard_bytes - shard_size)
                parts.append({"file": shard_name, "offset": shard_size, "nbytes": n_part})
                end = start + n_part
                while start < end:
                    control.check(f"writing step {step} ({written} of {payload.nbytes} bytes)")
                    chunk = view[start:min(end, start + CHUNK)]
                    futures.append(hash_ex.submit(shard_sum.update, chunk))
                    n = 0
                    while n < len(chunk):
                        n += shard_f.write(chunk[n:])
                    shard_size += len(chunk)
                    written += len(chunk)
                    start += len(chunk)
                    if control.progress:
                        control.progress(written)
            entries.append({**item.meta, "nbytes": item.nbytes, "parts": parts})
        close_shard()
        for fu in futures:
            fu.result()  # re-raises a checksum or fsync error
        control.check(f"finishing step {step}")
        write_file_durable(os.path.join(final, SKELETON), payload.skeleton)
        files[SKELETON] = {"size": len(payload.skeleton), "checksum": checksum.of_bytes(payload.skeleton, algorithm)}
        manifest = new_manifest(step, kind, payload.framework, durable, files, algorithm, arrays=entries, **(extra or {}))
        data = manifest_bytes(manifest)
        seal_dir(final, step, data, marker_bytes(step, data, algorithm), control)  # the single writer's commit
        return manifest
    except BaseException:
        hash_ex.shutdown(wait=True, cancel_futures=True)
        sync_ex.shutdown(wait=True)
        if shard_f is not None:
            shard_f.close()
        shutil.rmtree(final, ignore_errors=True)
        raise
    finally:
        hash_ex.shutdown(wait=False)
        sync_ex.shutdown(wait=False)


def read_manifest(step_dir: str) -> dict:
    """The manifest of a step directory, checked against its commit marker. Raises CorruptCheckpoint."""
    try:
        with open(os.path.join(step_dir, MARKER), "rb") as f:
            marker = f.read()
    except FileNotFoundError:
        raise CorruptCheckpoint("no commit marker (torn or in-progress save)") from None
    except OSError as exc:
        raise CorruptCheckpoint(f"unreadable commit marker: {exc}") from None
    try:
        with open(os.path.join(step_dir, MANIFEST), "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CorruptCheckpoint(f"manifest missing: {exc}") from None
    return parse_manifest(marker, data)


def parse_manifest(marker_data: bytes, data: bytes) -> dict:
    """A step's manifest from the bytes of its marker and manifest, checked against each other."""
    try:
        marker = json.loads(marker_data)
    except ValueError as exc:
        raise CorruptCheckpoint(f"unreadable commit marker: {exc}") from None
    algorithm = marker.get("checksum_algorithm", "crc32")
    if checksum.of_bytes(data, algorithm) != marker.get("manifest_checksum"):
        raise CorruptCheckpoint("manifest checksum does not match the commit marker")
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise CorruptCheckpoint(f"manifest is not JSON: {exc}") from None
    if manifest.get("format") != FORMAT or manifest.get("step") != marker.get("step"):
        raise CorruptCheckpoint("manifest format/step does not match the commit marker")
    return manifest


def verify(step_dir: str, data: bool = True) -> dict:
    """Check a committed step directory: marker, manifest, file sizes, and (data=True) every file's checksum;
    with data=False only the skeleton's checksum (load() checks the data files while it reads them).
    Returns the manifest; raises CorruptCheckpoint."""
    manifest = read_manifest(step_dir)
    algorithm = manifest["checksum_algorithm"]
    for name, want in manifest["files"].items():
        path = os.path.join(step_dir, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            raise CorruptCheckpoint(f"data file {name} is missing") from None
        if size != want["size"]:
            raise CorruptCheckpoint(f"data file {name} has {size} bytes, manifest says {want['size']} (truncated?)")
        if data or name == SKELETON:
            _, got = checksum.of_file(path, algorithm)
            if got != want["checksum"]:
                raise CorruptCheckpoint(f"data file {name} checksum {got} != manifest {want['checksum']}")
    return manifest


RANGE_BYTES = 32 << 20  # one local read job: long enough for full-speed sequential reads, short enough to spread a
# data file over every worker; also the smallest slice of a remote object (see slice_bytes)
READ_CHUNK = 4 << 20  # hashed right after it is read, while it is still in the CPU's cache
READ_WORKERS = 4  # local disk: keeps the disk's queue full and hashes on every core (2 cores: 1.1 -> 1.7 GB/s cold)


def slice_bytes(total: int, workers: int) -> int:
    """The range of one GET: objects are sliced only as far as it takes to give every connection work, as sliced
    downloads do (a step of fewer, larger files than connections), never below RANGE_BYTES; a step of many files
    is read one whole file per request (every request costs the server a copy of its slice)."""
    return max(RANGE_BYTES, -(-total // max(workers, 1)))


@dataclass
class Range:
    """Bytes [start, end) of one data file and the memory they go to, in order."""

    name: str
    start: int
    end: int
    views: list


def file_ranges(sizes: dict[str, int], range_bytes: int) -> list[Range]:
    """Each file of `sizes` cut into ranges of range_bytes from its start (the last one shorter), no memory yet:
    the ranges plan_reads gives the same files at the same range_bytes."""
    return [Range(name, start, min(size, start + range_bytes), [])
            for name, size in sizes.items() for start in range(0, size, range_bytes)]


def plan_reads(manifest: dict, range_bytes: int = RANGE_BYTES, into: dict | None = None) -> tuple[list, list[Range]]:
    """The arrays a step's manifest describes ([(entry, array)]: into[i] for entry i where it fits, else newly
    allocated), and the ranges of its data files that fill them. Raises CorruptCheckpoint where the manifest's
    parts do not tile its files exactly."""
    from .serialize import allocate

    arrays, segments, covered, into = [], {}, {}, into or {}
    for i, entry in enumerate(manifest["arrays"]):
        arr, view = allocate(entry, into.get(i))
        view, got = memoryview(view), 0
        for part in entry["parts"]:
            name, n = part["file"], part["nbytes"]
            if covered.get(name, 0) != part["offset"] or name not in manifest["files"]:
                raise CorruptCheckpoint(f"manifest parts of {name} are not contiguous")
            if got + n > entry["nbytes"]:
                raise CorruptCheckpoint(f"manifest parts of an array cover more than its {entry['nbytes']} bytes")
            if n:
                segments.setdefault(name, []).append(view[got:got + n])
            got += n
            covered[name] = part["offset"] + n
        if got != entry["nbytes"]:
            raise CorruptCheckpoint(f"manifest parts of an array cover {got} of {entry['nbytes']} bytes")
        arrays.append((entry, arr))
    for name, want in manifest["files"].items():
        if name != SKELETON and covered.get(name, 0) != want["size"]:
            raise CorruptCheckpoint(f"manifest arrays cover {covered.get(name, 0)} of {want['size']} bytes of {name}")
    ranges = []
    for name, segs in segments.items():
        current = Range(name, 0, 0, [])
        for seg in segs:
            i = 0
            while i < len(seg):
                take = min(len(seg) - i, range_bytes - (current.end - current.start))
                current.views.append(seg[i:i + take])
                current.end += take
                i += take
                if current.end - current.start == range_bytes:
                    ranges.append(current)
                    current = Range(name, current.end, current.end, [])
        if current.end > current.start:
            ranges.append(current)
    return arrays, ranges


def fill(stream, views: list, algorithm: str, what: str, on_chunk=None) -> int:
    """Read views' worth of bytes from `stream` (anything with readinto) straight into them, hashing each chunk as
    it lands, then handing it to on_chunk (in order). Returns the checksum value of those bytes."""
    c = checksum.Checksum(algorithm)
    for view in views:
        got = 0
        while got < len(view):
            n = stream.readinto(view[got:got + READ_CHUNK])
            if not n:
                raise CorruptCheckpoint(f"{what} ended early")
            c.update(view[got:got + n])
            if on_chunk is not None:
                on_chunk(view[got:got + n])
            got += n
    return c.value


def check_ranges(files: dict, ranges: list[Range], sums: list[int], algorithm: str) -> None:
    """Join the ranges' checksums per file (in file order) and compare each with `files` (the manifest's entries
    of the files read)."""
    whole: dict[str, int] = {}
    for r, value in sorted(zip(ranges, sums), key=lambda x: (x[0].name, x[0].start)):
        whole[r.name] = checksum.combine(whole.get(r.name, 0), value, r.end - r.start, algorithm)
    for name, want in files.items():
        got = f"{whole.get(name, 0):08x}"  # an empty file's checksum is 0 in both algorithms
        if got != want["checksum"]:
            raise CorruptCheckpoint(f"data file {name} checksum {got} != manifest {want['checksum']}")


def run_ranges(job, ranges: list, workers: int) -> list:
    """job(range) for every range on `workers` threads; results in order. The first error stops the others' start
    and is raised."""
    if not ranges:
        return []
    with ThreadPoolExecutor(min(workers, len(ranges)), thread_name_prefix="respawn-read") as ex:
        futures = [ex.submit(job, r) for r in ranges]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


class LocalSource:
    """A step directory on this host, read with parallel preads (one descriptor per file, shared by the threads)."""

    def __init__(self, step_dir: str) -> None:
        self.step_dir = step_dir
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.step_dir, name), "rb") as f:
            return f.read()

    def _fd(self, name: str) -> int:
        with self._lock:
            if name not in self._fds:
                self._fds[name] = os.open(os.path.join(self.step_dir, name), os.O_RDONLY)
            return self._fds[name]

    def fill(self, r: Range, algorithm: str) -> int:
        return fill(_PreadStream(self._fd(r.name), r.start), r.views, algorithm, f"{r.name}")

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


class _PreadStream:
    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset = fd, offset

    def readinto(self, view) -> int:
        n = os.preadv(self.fd, [view], self.offset)
        self.offset += n
        return n


def load_from(source, manifest: dict, workers: int = READ_WORKERS, range_bytes: int = RANGE_BYTES,
              like: Any = None):
    """Read a step into the saved state: the data files' ranges go straight into the arrays on `workers` threads,
    each range hashed as it arrives and the ranges' checksums joined per file; nothing is returned unless every
    file and the skeleton match the manifest (CorruptCheckpoint). The arrays are those of `like` (the live state
    this one replaces) where serialize.fill_targets finds them at the same place with the same dtype and shape,
    else new ones; a restore that fails may have overwritten some of like's. `source` has read(name) -> bytes and
    fill(range, algorithm) -> checksum value (LocalSource; storage.GCSStore's reader)."""
    from .serialize import fill_in, fill_targets, finish

    algorithm = manifest["checksum_algorithm"]
    skeleton = source.read(SKELETON)
    want = manifest["files"].get(SKELETON, {})
    if len(skeleton) != want.get("size") or checksum.of_bytes(skeleton, algorithm) != want.get("checksum"):
        raise CorruptCheckpoint(f"{SKELETON} does not match the manifest's size and checksum")
    tree = pickle.loads(skeleton)
    into = None if like is None else fill_targets(tree, like)
    arrays, ranges = plan_reads(manifest, range_bytes, into)
    check_ranges({n: f for n, f in manifest["files"].items() if n != SKELETON}, ranges,
                 run_ranges(lambda r: source.fill(r, algorithm), ranges, workers), algorithm)
    return fill_in(tree, [finish(entry, arr) for entry, arr in arrays])


def load(step_dir: str, manifest: dict | None = None, workers: int = READ_WORKERS, like: Any = None):
    """Read a step directory back into the saved state in one pass over its bytes (see load_from)."""
    manifest = manifest or verify(step_dir, data=False)
    source = LocalSource(step_dir)
    try:
        return load_from(source, manifest, workers, like=like)
    finally:
        source.close()
