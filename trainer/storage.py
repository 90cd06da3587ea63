"""Checkpoint stores: a local directory (`file:///abs/path` or a plain path) and `gs://bucket/prefix`.

Checkpoints are always written to a local directory first (format.write_checkpoint); a store other than that
directory receives a committed step by `put_step`, which copies the data files (in parallel for GCS), then the
manifest, then the commit marker, so a cut transfer leaves an uncommitted directory that restore ignores and
retention removes. `get_step` is the reverse, marker last too. In a job whose hosts have their own disks, every
host sends its own files with `put_files` and one process writes the manifest and marker with `commit_step` once
all of them are there.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from urllib.parse import urlparse

from . import format as fmt

UPLOAD_WORKERS = 8


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
    m = dict(manifest, durable="remote", uploaded_at=time.time())
    return json.dumps(m, indent=1).encode()


class _Store:
    def put_step(self, src_dir: str, step: int, manifest: dict, control=None) -> None:
        """Copy a committed step here: an uncommitted leftover of an earlier attempt goes, then the data files, then
        the manifest and the marker."""
        self.delete_step(step)
        self.put_files(src_dir, step, list(manifest["files"]), control)
        self.commit_step(step, manifest, control)


class LocalStore(_Store):
    """A directory of step_* directories."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = "file://" + self.root

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
            with open(os.path.join(src_dir, name), "rb") as s, open(os.path.join(dst, name), "wb") as d:
                shutil.copyfileobj(s, d, fmt.CHUNK)
                d.flush()
                os.fsync(d.fileno())

        _run_parallel([lambda n=n: copy(n) for n in names], control, 2, f"copying step {step}")

    def commit_step(self, step: int, manifest: dict, control=None) -> None:
        """The manifest, then the marker: the step's data files must be here already."""
        fmt.commit(self.step_dir(step), step, remote_manifest(manifest), control, manifest["checksum_algorithm"])

    def read(self, step: int, name: str) -> bytes:
        """One file of a step (e.g. its manifest)."""
        with open(os.path.join(self.step_dir(step), name), "rb") as f:
            return f.read()

    def get_step(self, step: int, local_root: str, control=None, names=None) -> str:
        """A local directory holding this step (for a local store: the directory itself, nothing copied)."""
        return self.step_dir(step)


class GCSStore(_Store):
    """gs://bucket/prefix through google-cloud-storage (STORAGE_EMULATOR_HOST is honoured)."""

    def __init__(self, uri: str, client=None, workers: int = UPLOAD_WORKERS) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "gs" or not parsed.netloc:
            raise ValueError(f"not a gs:// URI: {uri!r} (expected gs://bucket/prefix)")
        self.uri = uri.rstrip("/")
        self.bucket_name = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.workers = workers
        self._client = client
        self._bucket = None

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

    def _name(self, step: int, file: str = "") -> str:
        parts = [p for p in (self.prefix, fmt.step_dirname(step), file) if p]
        return "/".join(parts)

    def steps(self) -> dict[int, bool]:
        out: dict[int, bool] = {}
        base = self.prefix + "/" if self.prefix else ""
        for blob in self.bucket.client.list_blobs(self.bucket_name, prefix=base):
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
        """The manifest, then the marker: the step's data files must be uploaded already."""
        data = remote_manifest(manifest)
        self.bucket.blob(self._name(step, fmt.MANIFEST)).upload_from_string(data)
        if control is not None:
            control.check(f"committing upload of step {step}")
        self.bucket.blob(self._name(step, fmt.MARKER)).upload_from_string(
            fmt.marker_bytes(step, data, manifest["checksum_algorithm"]))

    def get_step(self, step: int, local_root: str, control=None, names=None) -> str:
        """Download a committed step into local_root/step_*/ (marker last) and return that directory.
        names: a function of the manifest giving the data files to fetch (default: all of them)."""
        from google.api_core import exceptions

        dst = os.path.join(local_root, fmt.step_dirname(step))
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        try:
            marker = self.bucket.blob(self._name(step, fmt.MARKER)).download_as_bytes()
            manifest_data = self.bucket.blob(self._name(step, fmt.MANIFEST)).download_as_bytes()
        except exceptions.NotFound as exc:
            raise fmt.CorruptCheckpoint(f"remote step {step} lacks its marker or manifest: {exc}") from None
        try:
            manifest = json.loads(manifest_data)
            wanted = list(manifest["files"]) if names is None else names(manifest)
        except (ValueError, KeyError) as exc:
            raise fmt.CorruptCheckpoint(f"remote manifest of step {step} is unreadable: {exc}") from None

        def download(name):
            path = os.path.join(dst, name)
            try:
                self.bucket.blob(self._name(step, name)).download_to_filename(path)
            except exceptions.NotFound:
                return  # verify() reports the missing file
            with open(path, "rb+") as f:
                os.fsync(f.fileno())

        _run_parallel([lambda n=n: download(n) for n in wanted], control, self.workers,
                      f"downloading step {step} from {self.uri}")
        fmt.write_file_durable(os.path.join(dst, fmt.MANIFEST), manifest_data)
        fmt.write_file_durable(os.path.join(dst, fmt.MARKER), marker)
        fmt.fsync_dir(dst)
        return dst


def open_store(uri: str):
    """A store for `gs://...`, `file:///abs/path` or a plain local path."""
    if uri.startswith("gs://"):
        return GCSStore(uri)
    if uri.startswith("file://"):
        path = urlparse(uri).path
        if not path.startswith("/"):
            raise ValueError(f"file:// checkpoint URI must be absolute: {uri!r} (e.g. file:///var/ckpt)")
        return LocalStore(path)
    if "://" in uri:
        raise ValueError(f"unsupported checkpoint URI {uri!r}: use gs://bucket/prefix or file:///abs/path")
    return LocalStore(uri)


__all__ = ["LocalStore", "GCSStore", "open_store"]
