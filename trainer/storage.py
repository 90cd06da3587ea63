"""Checkpoint stores: a local directory (`file:///abs/path` or a plain path) and `gs://bucket/prefix`.

Checkpoints are always written to a local directory first (format.write_checkpoint); a store other than that
directory receives a committed step by `put_step`, which copies the data files (in parallel for GCS), then seals
the step there (`commit_step`: the manifest, then the commit marker, respawn.ckpt.commit.seal), so a cut transfer
leaves an uncommitted directory that restore ignores and retention removes. `get_step` is the reverse, the step's own
marker last too; `load_step` reads a committed step straight into the saved state (CheckpointManager's restore), with
no local copy unless asked. In a job whose hosts have their own disks, every host sends its own files with
`put_files` and the member that seals the members' vote calls `commit_step` once all of them are there.

Reads from Cloud Storage are ranged GETs (fmt.slice_bytes) on `workers` keep-alive connections, as sliced
downloads do, read with readinto straight into their destination (the arrays, or a buffer written into place in
the local file) and hashed as they arrive; the ranges' checksums are joined into each file's (checksum.combine),
so every byte is fetched once and hashed once.
"""

from __future__ import annotations

import http.client
import os
import shutil
import threading
import time
from urllib.parse import quote, urlsplit

from respawn.contract import StoreUri

from . import format as fmt
from .commit import manifest_bytes, marker_bytes, seal, seal_dir, write_file_durable

UPLOAD_WORKERS = 8
GET_ATTEMPTS = 4  # a range whose connection fails, or that Cloud Storage answers 429/5xx, is fetched again
READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"


def _run_parallel(jobs, control: fmt.WriteControl | None, workers: int, what: str) -> None:
    """Run callables on daemon threads (a process that exits on a deadline must not wait for them), stopping
    at the control's deadline/cancel. Re-raises the first error."""
    pending = list(jobs)
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()
    remaining = [len(pending)]
    if not pending:
        return

    def worker():
        while True:
            with lock:
                if not pending or errors:
                    return
                job = pending.pop(0)
            try:
                if control is not None:
                    control.check(what)
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                with lock:
                    errors.append(exc)
                done.set()
                return
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

    for _ in range(min(workers, len(pending))):
        threading.Thread(target=worker, daemon=True, name="respawn-transfer").start()
    while not done.wait(0.05):
        if control is not None:
            try:
                control.check(what)
            except fmt.Abandoned:
                with lock:
                    pending.clear()
                raise
    if errors:
        raise errors[0]


def remote_manifest(manifest: dict) -> bytes:
    return manifest_bytes(dict(manifest, durable="remote", uploaded_at=time.time()))


class _Store:
    def put_step(self, src_dir: str, step: int, manifest: dict, control=None) -> None:
        """Copy a committed step here: an uncommitted leftover of an earlier attempt goes, then the data files, then
        the manifest and the marker."""
        self.delete_step(step)
        self.put_files(src_dir, step, list(manifest["files"]), control)
        self.commit_step(step, manifest, control)

    def load_step_from(self, source, step: int, copy_to: str | None = None, check=None,
                       workers: int = UPLOAD_WORKERS, like=None) -> tuple[dict, object]:
        """(manifest, state) of a step committed here, its bytes read from `source` (read(name) -> bytes,
        fill(range, algorithm, sink) -> checksum value: this store's objects, or a peer's copy of them) and every
        checksum checked against this store's manifest in that one read. copy_to: a local root the bytes are also
        written into (copy_to/step_*/, committed there once all of them verified). check(manifest) runs before any
        data is read (e.g. fmt.check_layout). like: the live state the arrays are read into where they fit
        (fmt.load_from)."""
        marker, manifest_data, manifest = self.committed_manifest(step)
        if check is not None:
            check(manifest)
        dst = None if copy_to is None else os.path.join(copy_to, fmt.step_dirname(step))
        if dst is not None:
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
        sink = None if dst is None else _FileSink(
            dst, {name: f["size"] for name, f in manifest["files"].items() if name != fmt.SKELETON})

        class Copying:
            def read(self, name: str) -> bytes:
                data = source.read(name)
                if dst is not None:
                    write_file_durable(os.path.join(dst, name), data)
                return data

            def fill(self, r: fmt.Range, algorithm: str) -> int:
                return source.fill(r, algorithm, sink)

        try:
            state = fmt.load_from(Copying(), manifest, workers, fmt.slice_bytes(manifest["total_bytes"], workers), like)
        finally:
            if sink is not None:
                sink.close()
        if dst is not None:
            seal_dir(dst, step, manifest_data, marker)
        return manifest, state


class LocalStore(_Store):
    """A directory of step_* directories."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = str(StoreUri(StoreUri.FILE, "", self.root))

    def __repr__(self) -> str:
        return f"LocalStore({self.root})"

    def step_dir(self, step: int) -> str:
        return os.path.join(self.root, fmt.step_dirname(step))

    def steps(self) -> dict[int, bool]:
        """{step: has commit marker} for every step directory present."""
        out: dict[int, bool] = {}
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return out
        for name in names:
            step = fmt.parse_step(name)
            if step is not None:
                out[step] = os.path.exists(os.path.join(self.root, name, fmt.MARKER))
        return out

    def delete_step(self, step: int) -> None:
        path = self.step_dir(step)
        # Marker first, so a crash half-way through leaves an uncommitted (ignored) directory, never a torn
        # directory that still claims to be committed.
        try:
            os.remove(os.path.join(path, fmt.MARKER))
        except FileNotFoundError:
            pass
        shutil.rmtree(path, ignore_errors=True)

    def put_files(self, src_dir: str, step: int, names: list[str], control=None) -> None:
        """Copy (and fsync) data files of a step; no marker. A file already there is replaced."""
        dst = self.step_dir(step)
        os.makedirs(dst, exist_ok=True)

        def copy(name):
            target = os.path.join(dst, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)  # a framework's step may hold folders
            with open(os.path.join(src_dir, name), "rb") as s, open(target, "wb") as d:
                shutil.copyfileobj(s, d, fmt.CHUNK)
                d.flush()
                os.fsync(d.fileno())

        _run_parallel([lambda n=n: copy(n) for n in names], control, 2, f"copying step {step}")

    def commit_step(self, step: int, manifest: dict, control=None) -> None:
        """Seal the step here (seal_dir): the step's data files must be here already."""
        data = remote_manifest(manifest)
        seal_dir(self.step_dir(step), step, data, marker_bytes(step, data, manifest["checksum_algorithm"]), control)

    def read(self, step: int, name: str) -> bytes:
        """One file of a step (e.g. its manifest)."""
        with open(os.path.join(self.step_dir(step), name), "rb") as f:
            return f.read()

    def committed_manifest(self, step: int) -> tuple[bytes, bytes, dict]:
        """(marker, manifest bytes, manifest) of a committed step, the manifest checked against the marker."""
        try:
            marker, data = self.read(step, fmt.MARKER), self.read(step, fmt.MANIFEST)
        except OSError as exc:
            raise fmt.CorruptCheckpoint(f"step {step} in {self.root} lacks its marker or manifest: {exc}") from None
        return marker, data, fmt.parse_manifest(marker, data)

    def get_step(self, step: int, local_root: str, control=None, names=None) -> str:
        """A local directory holding this step (for a local store: the directory itself, nothing copied)."""
        return self.step_dir(step)

    def load_step(self, step: int, copy_to: str | None = None, check=None, like=None) -> tuple[dict, object]:
        """(manifest, state) of a committed step, every checksum checked in the one read (fmt.load, into `like`
        where it fits). check(manifest) runs before any data is read (e.g. fmt.check_layout); copy_to: unused
        (already local)."""
        step_dir = self.step_dir(step)
        manifest = fmt.verify(step_dir, data=False)
        if check is not None:
            check(manifest)
        return manifest, fmt.load(step_dir, manifest, like=like)


class GCSStore(_Store):
    """gs://bucket/prefix through google-cloud-storage (STORAGE_EMULATOR_HOST is honoured)."""

    def __init__(self, uri: str, client=None, workers: int = UPLOAD_WORKERS) -> None:
        try:
            where = StoreUri.parse(uri)
        except ValueError:
            where = None
        if where is None or where.scheme != StoreUri.GS:
            raise ValueError(f"not a gs:// URI: {uri!r} (expected gs://bucket/prefix)")
        self.uri = uri.rstrip("/")
        self.bucket_name = where.bucket
        self.prefix = where.path.strip("/")
        self.workers = workers
        self._client = client
        self._bucket = None
        self._ranges: _RangeReader | None = None

    def __repr__(self) -> str:
        return f"GCSStore({self.uri})"

    @property
    def bucket(self):
        if self._bucket is None:
            if self._client is None:
                try:
                    from google.cloud import storage
                except ImportError:
                    raise RuntimeError("gs:// checkpoints need google-cloud-storage: pip install 'respawn[storage]'") from None
                if os.environ.get("STORAGE_EMULATOR_HOST"):
                    from google.auth.credentials import AnonymousCredentials

                    self._client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "respawn-local"),
                                                  credentials=AnonymousCredentials())
                else:
                    self._client = storage.Client()
            self._bucket = self._client.bucket(self.bucket_name)
        return self._bucket

    @property
    def ranges(self) -> _RangeReader:
        """Ranged reads of this bucket's objects at the client's endpoint, with the same kind of credentials."""
        if self._ranges is None:
            endpoint = self.bucket.client.api_endpoint
            if os.environ.get("STORAGE_EMULATOR_HOST"):
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()
            else:
                import google.auth

                credentials, _ = google.auth.default(scopes=[READ_SCOPE])
            self._ranges = _RangeReader(endpoint, self.bucket_name, credentials)
        return self._ranges

    def _name(self, step: int, file: str = "") -> str:
        parts = [p for p in (self.prefix, fmt.step_dirname(step), file) if p]
        return "/".join(parts)

    def steps(self) -> dict[int, bool]:
        out: dict[int, bool] = {}
        base = self.prefix + "/" if self.prefix else ""
        # Only the step directories: the root also holds the nodes' logs (.respawn-logs/, thousands of small objects
        # on a long job) and the environment cache, which a listing of every step must not page through.
        for blob in self.bucket.client.list_blobs(self.bucket_name, prefix=base + fmt.STEP_DIR_PREFIX):
            rel = blob.name[len(base):].split("/")
            if len(rel) != 2:
                continue
            step = fmt.parse_step(rel[0])
            if step is None:
                continue
            out[step] = out.get(step, False) or rel[1] == fmt.MARKER
        return out

    def delete_step(self, step: int) -> None:
        from google.api_core import exceptions

        try:
            self.bucket.blob(self._name(step, fmt.MARKER)).delete()
        except exceptions.NotFound:
            pass
        for blob in list(self.bucket.client.list_blobs(self.bucket_name, prefix=self._name(step) + "/")):
            try:
                blob.delete()
            except exceptions.NotFound:
                pass

    def read(self, step: int, name: str) -> bytes:
        """One object of a step (e.g. its manifest)."""
        return self.bucket.blob(self._name(step, name)).download_as_bytes()

    def put_files(self, src_dir: str, step: int, names: list[str], control=None) -> None:
        """Upload data files of a step (in parallel); no marker. An object already there is replaced."""

        def upload(name):
            self.bucket.blob(self._name(step, name)).upload_from_filename(os.path.join(src_dir, name))

        _run_parallel([lambda n=n: upload(n) for n in names], control, self.workers,
                      f"uploading step {step} to {self.uri}")

    def commit_step(self, step: int, manifest: dict, control=None) -> None:
        """Seal the step here (seal: an object is durable once its upload returns): the step's data files must be
        uploaded already."""
        data = remote_manifest(manifest)
        seal(lambda name, blob: self.bucket.blob(self._name(step, name)).upload_from_string(blob), step, data,
             marker_bytes(step, data, manifest["checksum_algorithm"]), control)

    def committed_manifest(self, step: int) -> tuple[bytes, bytes, dict]:
        """(marker, manifest bytes, manifest) of a remote step, the manifest checked against the marker."""
        from google.api_core import exceptions

        try:
            marker = self.bucket.blob(self._name(step, fmt.MARKER)).download_as_bytes()
            data = self.bucket.blob(self._name(step, fmt.MANIFEST)).download_as_bytes()
        except exceptions.NotFound as exc:
            raise fmt.CorruptCheckpoint(f"remote step {step} lacks its marker or manifest: {exc}") from None
        return marker, data, fmt.parse_manifest(marker, data)

    def get_step(self, step: int, local_root: str, control=None, names=None) -> str:
        """Download a committed step into local_root/step_*/ (marker last) and return that directory; every file
        is checked against the manifest as it arrives (CorruptCheckpoint). names: a function of the manifest giving
        the data files to fetch (default: all of them)."""
        marker, manifest_data, manifest = self.committed_manifest(step)
        try:
            wanted = list(manifest["files"]) if names is None else names(manifest)
            sizes = {name: manifest["files"][name]["size"] for name in wanted}
        except (ValueError, KeyError) as exc:
            raise fmt.CorruptCheckpoint(f"remote manifest of step {step} is unreadable: {exc}") from None
        dst = os.path.join(local_root, fmt.step_dirname(step))
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        ranges = fmt.file_ranges(sizes, fmt.slice_bytes(sum(sizes.values()), self.workers))
        sink = _FileSink(dst, sizes)
        scratch = threading.local()  # one chunk-sized buffer per thread: each chunk is written into place before
        # the next one is read into the same memory

        def fetch(r: fmt.Range) -> int:
            if control is not None:
                control.check(f"downloading step {step} from {self.uri}")
            if getattr(scratch, "buf", None) is None:
                scratch.buf = memoryview(bytearray(fmt.READ_CHUNK))
            n, chunk = r.end - r.start, fmt.READ_CHUNK
            views = [scratch.buf] * (n // chunk) + ([scratch.buf[:n % chunk]] if n % chunk else [])
            return self.ranges.fill(self._name(step, r.name), r, views, manifest["checksum_algorithm"], sink)

        try:
            sums = fmt.run_ranges(fetch, ranges, self.workers)
        finally:
            sink.close()
        fmt.check_ranges({n: manifest["files"][n] for n in wanted}, ranges, sums, manifest["checksum_algorithm"])
        seal_dir(dst, step, manifest_data, marker)
        return dst

    def load_step(self, step: int, copy_to: str | None = None, check=None, like=None) -> tuple[dict, object]:
        """(manifest, state) of a remote committed step read straight into the arrays (fmt.load_from), every
        checksum checked in that one read (load_step_from). copy_to: a local root the bytes are also written into;
        CheckpointManager's restore passes none, since the copy costs the restore a disk write of the whole state
        (docs/performance.md, bench.restore). check(manifest) runs before any data is read (e.g. fmt.check_layout)."""
        return self.load_step_from(_ObjectSource(self, step), step, copy_to, check, self.workers, like)


class _ObjectSource:
    """The objects of one remote step, for load_step_from: whole small ones, ranged GETs of the data files."""

    def __init__(self, store: GCSStore, step: int) -> None:
        self.store, self.step = store, step

    def read(self, name: str) -> bytes:
        return self.store.read(self.step, name)

    def fill(self, r: fmt.Range, algorithm: str, sink: _FileSink | None) -> int:
        return self.store.ranges.fill(self.store._name(self.step, r.name), r, r.views, algorithm, sink)


class _FileSink:
    """The local copy of a downloaded step: each file created at its full size and written in place (pwrite) as
    its ranges arrive. Not fsync'd: it is a copy of a step committed remotely, and a copy torn by a crash fails its
    checksums at the next restore, which then reads the remote copy of the same step (CheckpointManager's search)."""

    def __init__(self, step_dir: str, sizes: dict[str, int]) -> None:
        self._fds = {}
        for name, size in sizes.items():
            path = os.path.join(step_dir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)  # a framework's step may hold folders
            fd = self._fds[name] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(fd, size)

    def writer(self, name: str, offset: int):
        """A callable writing consecutive chunks of file `name` from `offset` on."""
        fd, at = self._fds[name], [offset]

        def write(chunk) -> None:
            done = 0
            while done < len(chunk):
                done += os.pwrite(fd, chunk[done:], at[0] + done)
            at[0] += len(chunk)

        return write

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _RangeReader:
    """Ranged GETs of a bucket's objects (the JSON API's media download) on one keep-alive connection per thread,
    through http.client: a response is read with readinto straight into its destination (the client library reads
    8 KiB chunks into new bytes objects, which holds one core busy at ~450 MB/s on the 2-core development VM)."""

    def __init__(self, endpoint: str, bucket: str, credentials) -> None:
        url = urlsplit(endpoint)
        self.https = url.scheme == "https"
        self.host, self.port = url.hostname, url.port
        self.base = url.path.rstrip("/") + f"/download/storage/v1/b/{quote(bucket, safe='')}/o/"
        self.credentials = credentials
        self._local = threading.local()
        self._auth_lock = threading.Lock()
        self._auth_request = None

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self._local.conn = cls(self.host, self.port, timeout=60)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def fill(self, name: str, r: fmt.Range, views: list, algorithm: str, sink: _FileSink | None = None) -> int:
        """Bytes [r.start, r.end) of object `name` into views (and each chunk into place in the sink's file
        r.name); returns their checksum value. A missing or short object is CorruptCheckpoint; a failed connection
        or a 429/5xx is tried again."""
        for attempt in range(GET_ATTEMPTS):
            try:
                response = self._get(name, r.start, r.end)
                value = fmt.fill(response, views, algorithm, f"gs object {name} bytes {r.start}-{r.end - 1}",
                                 None if sink is None else sink.writer(r.name, r.start))
                if response.read(1):
                    raise fmt.CorruptCheckpoint(f"gs object {name} sent more than bytes {r.start}-{r.end - 1}")
                return value
            except (OSError, http.client.HTTPException, _Transient) as exc:
                self._drop_connection()
                if attempt + 1 == GET_ATTEMPTS:
                    raise RuntimeError(f"reading gs object {name} bytes {r.start}-{r.end - 1} failed "
                                       f"{GET_ATTEMPTS} times: {type(exc).__name__}: {exc}") from None
                time.sleep(0.5 * 2 ** attempt)
            except BaseException:
                self._drop_connection()
                raise
        raise AssertionError("unreachable")

    def _get(self, name: str, start: int, end: int) -> http.client.HTTPResponse:
        path = self.base + quote(name, safe="") + "?alt=media"
        headers = {"Range": f"bytes={start}-{end - 1}"}
        with self._auth_lock:  # one token refresh for all threads
            if self._auth_request is None:
                from google.auth.transport.requests import Request

                self._auth_request = Request()
            self.credentials.before_request(self._auth_request, "GET", f"https://{self.host}{path}", headers)
        conn = self._connection()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        status = response.status
        length = response.getheader("Content-Length")
        if status == 206 or (status == 200 and start == 0 and length is not None and int(length) == end):
            if length is not None and int(length) != end - start:
                response.read()
                raise fmt.CorruptCheckpoint(f"gs object {name}: {length} bytes for bytes {start}-{end - 1} "
                                            "(shorter than the manifest says)")
            return response
        body = response.read()[:300].decode(errors="replace")
        if status in (404, 416):
            raise fmt.CorruptCheckpoint(f"gs object {name} is missing or shorter than the manifest says "
                                        f"(HTTP {status} for bytes {start}-{end - 1})")
        if status == 429 or status >= 500:
            raise _Transient(f"HTTP {status}: {body}")
        raise RuntimeError(f"reading gs object {name} answered HTTP {status}: {body} (check the bucket and the "
                           "credentials' storage.objects.get permission)")


class _Transient(Exception):
    pass


def open_store(uri: str):
    """A store for `gs://...`, `file:///abs/path` or a plain local path."""
    if "://" not in uri:
        return LocalStore(uri)
    try:
        where = StoreUri.parse(uri)
    except ValueError as exc:
        raise ValueError(f"checkpoint URI {exc}") from None
    return GCSStore(uri) if where.local_path is None else LocalStore(where.local_path)


__all__ = ["LocalStore", "GCSStore", "open_store"]
