"""Download one object — the user's workdir archive, the respawn wheel — to a local file, checking its sha256;
and upload one (Uploader: the environment cache's archive, streamed, and its manifest).

gs://BUCKET/OBJECT: the Cloud Storage JSON API, `GET {host}/storage/v1/b/BUCKET/o/OBJECT?alt=media` with the VM's
service-account token from the metadata server; host = RESPAWN_STORAGE_HOST, else STORAGE_EMULATOR_HOST (local
runs), else https://storage.googleapis.com. file:///PATH: a copy (the local stand-ins). The standard library only,
streamed in 1 MiB chunks (never the whole object in memory), no proxies (as the rest of the agent).

Transient trouble (connection errors, timeouts, 429, 5xx) is retried with backoff for `retry_seconds`; what
retrying cannot fix (404, 403, other 4xx) raises FetchError at once, its message naming the object and what to do.

Uploads go to `POST {host}/upload/storage/v1/b/BUCKET/o`: a small object in one request (uploadType=media), a
stream of unknown length as a resumable upload in UPLOAD_CHUNK pieces (each a multiple of 256 KiB but the last; the
object exists only once the last piece is in, so an upload stopped half-way leaves nothing visible). A file:///
destination is written beside its name and renamed into place when complete. Uploads are not retried: the one
caller (the environment cache) is best-effort and fails over to what it did before.
"""

from __future__ import annotations

import abc
import hashlib
import http.client
import json
import os
import time
from typing import BinaryIO, Callable
from urllib.parse import quote, urlsplit

from respawn.contract import StoreUri
from respawn.logs import log

from .metadata import TRANSPORT_ERRORS, MetadataClient, MetadataError, ServiceAccountToken, TokenError

PRODUCTION_HOST = "https://storage.googleapis.com"
CHUNK = 1 << 20
UPLOAD_CHUNK = 16 << 20  # a multiple of 256 KiB, as a resumable upload's pieces must be
RESUME_INCOMPLETE = 308  # a resumable upload's answer to a piece that is not the last


class FetchError(Exception):
    """The object could not be downloaded; the message names it and what to do. `status`: the HTTP status."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class Interrupted(Exception):
    """A notice (or SIGHUP) came while downloading: the partial file is worthless, the caller stops."""


def storage_host(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    host = env.get("RESPAWN_STORAGE_HOST") or env.get("STORAGE_EMULATOR_HOST") or PRODUCTION_HOST
    if "://" not in host:
        host = "http://" + host  # STORAGE_EMULATOR_HOST is often given as host:port
    return host.rstrip("/")


def object_at(uri: str, error: type[Exception], verb: str) -> StoreUri:
    """`uri` as one object's place: a file:/// path, or gs://BUCKET/OBJECT; `error` naming it otherwise (`verb`:
    what cannot be done to it)."""
    try:
        where = StoreUri.parse(uri)
    except ValueError:
        raise error(f"{uri}: only gs:// and file:/// URIs can be {verb}") from None
    if where.scheme == StoreUri.GS and not where.path:
        raise error(f"{uri} is not gs://BUCKET/OBJECT")
    return where


def _bucket_of(uri: str) -> str:
    """The bucket of a gs:// URI, for a message; "?" for anything else."""
    try:
        return StoreUri.parse(uri).bucket or "?"
    except ValueError:
        return "?"


def http_failure(uri: str, status: int, body: str, *, missing_hint: str, account: str | None) -> FetchError:
    """What an HTTP error status means for `uri`, and what to do about it."""
    bucket = _bucket_of(uri)
    detail = body.strip().replace("\n", " ")[:200]
    if status == 404:
        return FetchError(f"{uri} does not exist (HTTP 404): {missing_hint}", status)
    if status in (401, 403):
        who = f"the node's service account {account}" if account else "the node's service account"
        member = f"serviceAccount:{account}" if account else "serviceAccount:NODE_SERVICE_ACCOUNT"
        return FetchError(
            f"{who} may not read {uri} (HTTP {status}: {detail}): it needs storage.objects.get on gs://{bucket}; "
            f"grant it, e.g. gcloud storage buckets add-iam-policy-binding gs://{bucket} --member={member} "
            f"--role=roles/storage.objectViewer", status)
    return FetchError(f"downloading {uri} failed with HTTP {status}: {detail}", status)


def _transient(status: int) -> bool:
    return status == 429 or status == 408 or status >= 500


class Fetcher:
    """Downloads gs:// and file:/// objects; one per agent (it keeps the access token)."""

    def __init__(self, md: MetadataClient, *, environ: dict[str, str] | None = None, retry_seconds: float = 300.0,
                 timeout: float = 60.0):
        self.md = md
        self.host = storage_host(environ)
        self.retry_seconds, self.timeout = retry_seconds, timeout
        self._token = ServiceAccountToken(md)

    def fetch(self, uri: str, dest: str, *, missing_hint: str,
              interrupted: Callable[[], bool] = lambda: False) -> tuple[int, str]:
        """Write the object at `uri` to the file `dest` (replaced). Returns (bytes, sha256 hex)."""
        where = object_at(uri, FetchError, "downloaded")
        if where.local_path is not None:
            return self._copy(uri, where.local_path, dest, missing_hint, interrupted)
        bucket, name = where.bucket, where.path
        url = f"{self.host}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?alt=media"
        deadline = time.monotonic() + self.retry_seconds
        delay, tries = 1.0, 0
        while True:
            tries += 1
            try:
                return self._get(uri, url, dest, missing_hint, interrupted)
            except FetchError as exc:
                if exc.status is None or not _transient(exc.status) or time.monotonic() + delay > deadline:
                    raise
                problem = str(exc)
            except TRANSPORT_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    raise FetchError(f"downloading {uri} from {self.host} failed {tries} times over "
                                     f"{self.retry_seconds:.0f} s; last error: {exc!r}. Check the node's network "
                                     "(Private Google Access on a subnet without external IPs)") from None
                problem = repr(exc)
            log("WARNING", "download failed; retrying", uri=uri, error=problem, tries=tries, retry_in_s=delay)
            end = time.monotonic() + delay
            while time.monotonic() < end:
                if interrupted():
                    raise Interrupted(uri)
                time.sleep(min(0.2, max(0.0, end - time.monotonic())))
            delay = min(delay * 2, 30.0)

    def _account(self) -> str | None:
        try:
            return self.md.read("instance/service-accounts/default/email", timeout=2.0)[0].strip() or None
        except (MetadataError, *TRANSPORT_ERRORS):
            return None

    def _get(self, uri: str, url: str, dest: str, missing_hint: str,
             interrupted: Callable[[], bool]) -> tuple[int, str]:
        try:
            token = self._token.get()
        except TokenError as exc:
            raise FetchError(f"cannot download {uri}: {exc}") from None
        parts = urlsplit(url)
        if parts.scheme == "https":
            import ssl  # only the real endpoint needs TLS (as in _http)

            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.netloc, timeout=self.timeout, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(parts.netloc, timeout=self.timeout)
        try:
            conn.request("GET", f"{parts.path}?{parts.query}", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            if resp.status != 200:
                body = resp.read(4096).decode("utf-8", errors="replace")
                try:
                    body = json.loads(body)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                account = self._account() if resp.status in (401, 403) else None
                raise http_failure(uri, resp.status, body, missing_hint=missing_hint, account=account)
            with open(dest, "wb") as out:
                return _pump(resp, out, interrupted, uri)
        finally:
            conn.close()

    def _copy(self, uri: str, path: str, dest: str, missing_hint: str,
              interrupted: Callable[[], bool]) -> tuple[int, str]:
        try:
            src = open(path, "rb")
        except FileNotFoundError:
            raise FetchError(f"{uri} does not exist: {missing_hint}", 404) from None
        except OSError as exc:
            raise FetchError(f"cannot read {uri}: {exc}") from None
        with src, open(dest, "wb") as out:
            return _pump(src, out, interrupted, uri)


def _pump(src: BinaryIO, out: BinaryIO, interrupted: Callable[[], bool], uri: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    while True:
        if interrupted():
            raise Interrupted(uri)
        chunk = src.read(CHUNK)
        if not chunk:
            break
        digest.update(chunk)
        out.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


class UploadError(Exception):
    """An upload failed; the message names the object and what to do."""


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme == "https":
        import ssl

        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.netloc, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    return conn, parts.path + (f"?{parts.query}" if parts.query else "")


class Uploader:
    """Uploads to gs:// and file:/// with the VM's service account; `open(uri)` streams one object."""

    def __init__(self, md: MetadataClient, *, environ: dict[str, str] | None = None, timeout: float = 120.0):
        self.host = storage_host(environ)
        self.timeout = timeout
        self._token = ServiceAccountToken(md)

    def _headers(self, uri: str, **extra: str) -> dict[str, str]:
        try:
            return {"Authorization": f"Bearer {self._token.get()}", **extra}
        except TokenError as exc:
            raise UploadError(f"cannot upload {uri}: {exc}") from None

    def _send(self, uri: str, method: str, url: str, body: bytes, headers: dict[str, str]):
        conn, path = _connection(url, self.timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except TRANSPORT_ERRORS as exc:
            raise UploadError(f"uploading {uri} to {self.host} failed: {exc!r}; check the node's network") from None
        finally:
            conn.close()
        if resp.status not in (200, 201, RESUME_INCOMPLETE):
            raise _upload_failure(uri, resp.status, data.decode("utf-8", errors="replace"))
        return resp

    def put(self, uri: str, data: bytes) -> None:
        """Write the small object `uri` in one request. Sent as application/octet-stream whatever it holds: the
        storage emulator reads an application/json body as the object's metadata, not its content."""
        where = object_at(uri, UploadError, "uploaded to")
        if where.local_path is not None:
            _put_local(where.local_path, data)
            return
        url = (f"{self.host}/upload/storage/v1/b/{quote(where.bucket, safe='')}/o?uploadType=media&"
               f"name={quote(where.path, safe='')}")
        self._send(uri, "POST", url, data, self._headers(uri, **{"Content-Type": "application/octet-stream"}))

    def open(self, uri: str, interrupted: Callable[[], bool]) -> "UploadStream":
        """A writable stream for `uri`: write(), then commit() (the object appears) or abort()."""
        where = object_at(uri, UploadError, "uploaded to")
        if where.local_path is not None:
            return _LocalStream(uri, where.local_path, interrupted)
        url = (f"{self.host}/upload/storage/v1/b/{quote(where.bucket, safe='')}/o?uploadType=resumable&"
               f"name={quote(where.path, safe='')}")
        resp = self._send(uri, "POST", url, b"", self._headers(uri, **{
            "Content-Type": "application/json; charset=UTF-8", "X-Upload-Content-Type": "application/x-tar"}))
        session = resp.getheader("Location")
        if not session:
            raise UploadError(f"uploading {uri}: Cloud Storage started no resumable upload (no Location header)")
        return _ResumableStream(self, uri, session, interrupted)


def _upload_failure(uri: str, status: int, body: str) -> UploadError:
    try:
        body = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    detail = body.strip().replace("\n", " ")[:200]
    if status in (401, 403):
        return UploadError(f"the node's service account may not write {uri} (HTTP {status}: {detail}): it needs "
                           f"storage.objects.create on gs://{_bucket_of(uri)} under the job's checkpoint_uri")
    return UploadError(f"uploading {uri} failed with HTTP {status}: {detail}")


def _put_local(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.partial-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class UploadStream(abc.ABC):
    """Bytes written are counted (`size`) and hashed (`sha256`); a notice (`interrupted()`) raises Interrupted at
    the next write. A destination implements _write, commit and abort."""

    def __init__(self, uri: str, interrupted: Callable[[], bool]):
        self.uri, self.interrupted = uri, interrupted
        self.size = 0
        self._digest = hashlib.sha256()

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def write(self, data: bytes) -> int:
        if self.interrupted():
            raise Interrupted(self.uri)
        self._digest.update(data)
        self.size += len(data)
        self._write(data)
        return len(data)

    @abc.abstractmethod
    def _write(self, data: bytes) -> None:
        """Send `data` on (after it was counted and hashed)."""

    @abc.abstractmethod
    def commit(self) -> None:
        """Make what was written the object, whole, or raise."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop what was written: nothing of it becomes visible."""


class _LocalStream(UploadStream):
    def __init__(self, uri: str, path: str, interrupted: Callable[[], bool]):
        super().__init__(uri, interrupted)
        self.path = path
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.tmp = f"{self.path}.partial-{os.getpid()}"
        self._file = open(self.tmp, "wb")

    def _write(self, data: bytes) -> None:
        self._file.write(data)

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


class _ResumableStream(UploadStream):
    def __init__(self, uploader: Uploader, uri: str, session: str, interrupted: Callable[[], bool]):
        super().__init__(uri, interrupted)
        self.uploader, self.session = uploader, session
        self._buf = bytearray()
        self._sent = 0

    def _write(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= UPLOAD_CHUNK:
            del self._buf[:self._piece(bytes(self._buf[:UPLOAD_CHUNK]), last=False)]

    def _piece(self, data: bytes, *, last: bool) -> int:
        """Send one piece; returns how many of its bytes Cloud Storage kept (it may keep fewer than were sent:
        its answer's Range says up to where; the rest goes again with the next piece)."""
        total = str(self._sent + len(data)) if last else "*"
        span = f"{self._sent}-{self._sent + len(data) - 1}" if data else "*"
        resp = self.uploader._send(self.uri, "PUT", self.session, data, self.uploader._headers(
            self.uri, **{"Content-Range": f"bytes {span}/{total}"}))
        if last:
            if resp.status == RESUME_INCOMPLETE:
                raise UploadError(f"uploading {self.uri}: Cloud Storage did not complete the object after its last "
                                  f"piece ({total} bytes)")
            kept = len(data)
        else:
            persisted = (resp.getheader("Range") or "").rpartition("-")[2]
            kept = (int(persisted) + 1 if persisted.isdigit() else 0) - self._sent
            if not 0 < kept <= len(data):  # none kept: sending it again would go round for ever
                raise UploadError(f"uploading {self.uri}: Cloud Storage says it holds bytes up to {persisted!r} "
                                  f"after the piece {span}")
        self._sent += kept
        return kept

    def commit(self) -> None:
        if self.interrupted():
            raise Interrupted(self.uri)
        self._piece(bytes(self._buf), last=True)
        self._buf.clear()

    def abort(self) -> None:
        # An unfinished resumable upload creates no object; Cloud Storage drops the session after a week.
        self._buf.clear()
