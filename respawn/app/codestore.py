"""The CLI's Cloud Storage adapter: puts a packed workdir (respawn.app.workdir) where the job's nodes fetch it, with
the user's own credentials.

The archive is content-addressed (respawn.app.workdir.workdir_uri): gs://BUCKET/respawn/workdirs/sha256-HEX.tar.gz in
the bucket of the job's checkpoint_uri, or, for a file:///PATH checkpoint_uri (local runs), the directory
respawn-workdirs beside PATH. The same name always holds the same bytes, so an archive already there is not sent
again, and the write is create-only (if_generation_match=0; a hard link for a local directory): two
registrations of one tree at once both succeed and leave one intact object.

It also lists and reads a job's shipped logs for `respawn jobs logs` (list_logs, read_log; respawn.joblogs).

google-cloud-storage honours STORAGE_EMULATOR_HOST (the tests' emulator and stand-ins) with anonymous credentials.
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from requests import Timeout

from respawn.contract import StoreUri
from respawn.joblogs import Listed, list_local

from . import endpoints
from .workdir import PackedWorkdir, human_bytes, workdir_uri

# Above this the upload goes in resumable chunks of this size (a multiple of 256 KiB), so progress can be shown.
CHUNK_BYTES = 8 * 1024 * 1024
EMULATOR_PROJECT = "respawn-local"
LOGIN_HINT = "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a key file)"

Progress = Callable[[int, int], None]  # (bytes sent, bytes in all)
# Each read's deadline, its retries included (the library's: 60 s a request, retried for 120 s): an endpoint that
# answered the probe and then stops answering ends the command within 10 s, in one line (respawn.app.endpoints).
CALL = {"timeout": endpoints.CALL_DEADLINE_S, "retry": DEFAULT_RETRY.with_timeout(endpoints.CALL_DEADLINE_S)}
# An upload's: connected within the deadline, each of its reads as slow as a large chunk may be (its progress shows).
UPLOAD_TIMEOUT = (endpoints.CALL_DEADLINE_S, 60.0)
UNANSWERED = (gexc.RetryError, gexc.DeadlineExceeded, Timeout)  # a call past its deadline


class CodeStoreError(Exception):
    """A failed upload the user can act on, said in one line naming the bucket or object."""


@dataclass(frozen=True)
class Uploaded:
    uri: str
    sent: bool  # False: the archive was already there (an earlier or concurrent registration of the same tree)


def upload(packed: PackedWorkdir, checkpoint_uri: str, project: str | None = None,
           progress: Progress | None = None) -> Uploaded:
    """Put the archive at workdir_uri(checkpoint_uri, …) unless it is there already. Raises CodeStoreError."""
    uri = workdir_uri(checkpoint_uri, packed.sha256)
    where = StoreUri.parse(uri)
    if where.local_path is not None:
        return _put_local(uri, where.local_path, packed, progress)
    return _put_gcs(uri, where, packed, project, progress)


# ---- a local directory (file:/// checkpoint URIs: the demo and local runs) -----------------------------------

def _put_local(uri: str, path: str, packed: PackedWorkdir, progress: Progress | None) -> Uploaded:
    directory = os.path.dirname(path)
    if os.path.exists(path):
        _check_size(uri, os.path.getsize(path), packed.size, f"rm {path}")
        return Uploaded(uri, False)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=directory)
    except OSError as exc:
        raise CodeStoreError(f"cannot write the workdir archive to {directory}: {exc.strerror}; fix the "
                             "directory's permissions or the job's checkpoint_uri") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(packed.data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)  # create-only, atomic: the local if_generation_match=0
        except FileExistsError:
            return Uploaded(uri, False)
    except OSError as exc:
        raise CodeStoreError(f"cannot write the workdir archive {path}: {exc.strerror}") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    if progress is not None:
        progress(packed.size, packed.size)
    return Uploaded(uri, True)


# ---- Cloud Storage -------------------------------------------------------------------------------------------

def client(project: str | None) -> storage.Client:
    """A storage client with Application Default Credentials, or anonymous ones for STORAGE_EMULATOR_HOST, once its
    endpoint answers (respawn.app.endpoints.check: seconds, not the library's minutes of retries)."""
    try:
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            endpoints.check(endpoints.STORAGE)
            return storage.Client(project=project or EMULATOR_PROJECT, credentials=AnonymousCredentials())
        found = storage.Client(project=project)  # credentials first: without them, that is what to say
        endpoints.check(endpoints.STORAGE, found.project)
        return found
    except endpoints.Unreachable as exc:
        raise CodeStoreError(str(exc)) from None
    except DefaultCredentialsError:
        raise CodeStoreError(f"no Google Cloud credentials to upload the workdir: {LOGIN_HINT}") from None


class _Reporting(io.RawIOBase):
    """The archive's bytes, reporting how many the client has read (sent, chunk by chunk) so far."""

    def __init__(self, data: bytes, progress: Progress | None):
        self.buf, self.progress, self.total = io.BytesIO(data), progress, len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.buf.seek(offset, whence)

    def tell(self) -> int:
        return self.buf.tell()

    def read(self, n: int = -1) -> bytes:
        chunk = self.buf.read(n)
        if self.progress is not None:
            self.progress(self.buf.tell(), self.total)
        return chunk


def _put_gcs(uri: str, where: StoreUri, packed: PackedWorkdir, project: str | None,
             progress: Progress | None) -> Uploaded:
    bucket_name = where.bucket
    blob = client(project).bucket(bucket_name).blob(where.path)
    try:
        try:
            blob.reload(**CALL)
        except gexc.NotFound:
            pass  # no such object (or no such bucket: the upload says which)
        except gexc.Forbidden:
            pass  # no storage.objects.get: the create-only upload below still cannot overwrite anything
        else:
            _check_size(uri, blob.size, packed.size, f"gcloud storage rm {uri}")
            return Uploaded(uri, False)
        if packed.size > CHUNK_BYTES:
            blob.chunk_size = CHUNK_BYTES
        try:
            blob.upload_from_file(_Reporting(packed.data, progress), size=packed.size,
                                  content_type="application/gzip", if_generation_match=0, timeout=UPLOAD_TIMEOUT)
        except gexc.PreconditionFailed:
            return Uploaded(uri, False)  # written meanwhile by another registration: same name, same bytes
    except gexc.NotFound:
        raise CodeStoreError(
            f"bucket {bucket_name!r} does not exist (it is the bucket of the job's checkpoint_uri, where the "
            f"workdir archive goes); create it (gcloud storage buckets create gs://{bucket_name} "
            "--location=REGION) or fix checkpoint_uri") from None
    except gexc.Forbidden as exc:
        raise CodeStoreError(
            f"permission denied writing {uri}: your account needs storage.objects.create on bucket "
            f"{bucket_name!r} (e.g. roles/storage.objectCreator: gcloud storage buckets add-iam-policy-binding "
            f"gs://{bucket_name} --member=user:YOU --role=roles/storage.objectCreator); Cloud Storage said: "
            f"{_said(exc)}") from None
    except UNANSWERED:
        raise CodeStoreError(_unanswered()) from None
    except gexc.Unauthorized as exc:
        raise CodeStoreError(f"Cloud Storage refused the credentials uploading {uri} ({_said(exc)}): {LOGIN_HINT}") from None
    except (RefreshError, DefaultCredentialsError) as exc:
        raise CodeStoreError(f"Google Cloud credentials could not be used to upload {uri} ({exc}): {LOGIN_HINT}") from None
    except gexc.GoogleAPIError as exc:
        raise CodeStoreError(f"uploading the workdir archive to {uri} failed: {exc}; retry, or check the bucket "
                             "with `gcloud storage ls gs://" + bucket_name + "`") from None
    except (TransportError, OSError) as exc:  # requests' connection errors are OSErrors
        raise CodeStoreError(f"cannot reach Cloud Storage to upload {uri}: {exc}; check the network and retry") from None
    return Uploaded(uri, True)


def _unanswered() -> str:
    """The one line for a call past its deadline: the endpoint, and the likely cause."""
    return endpoints.unanswered(endpoints.STORAGE, endpoints.late())


def _said(exc: gexc.GoogleAPIError) -> str:
    return getattr(exc, "message", None) or str(exc)


def _check_size(uri: str, found: int | None, expected: int, remove: str) -> None:
    """An object under a content address with another size is not what its name says: never use it."""
    if found is not None and found != expected:
        raise CodeStoreError(
            f"{uri} exists but holds {human_bytes(found)}, not the {human_bytes(expected)} its name promises "
            f"(a damaged or foreign object); delete it (`{remove}`) and register again")


# ---- per-attempt logs (respawn jobs logs; respawn.joblogs, contract.LogChunk) -----------------------------------

@functools.lru_cache(maxsize=4)
def _log_client(project: str | None) -> storage.Client:
    return client(project)  # one per CLI run: --follow lists and reads again and again


def list_logs(base: str, prefix: str = "", project: str | None = None) -> list[Listed]:
    """Every object below `base` (contract.logs_uri(checkpoint_uri)) whose name there starts with `prefix`, named
    relative to `base`. Raises CodeStoreError."""
    where = StoreUri.parse(base)
    if where.local_path is not None:
        return list_local(where.local_path, prefix)
    bucket, under = where.bucket, where.path
    try:
        return [Listed(b.name[len(under):], b.size or 0, b.updated.timestamp() if b.updated else 0.0)
                for b in _log_client(project).list_blobs(bucket, prefix=under + prefix, **CALL)]
    except UNANSWERED:
        raise CodeStoreError(_unanswered()) from None
    except gexc.Forbidden as exc:
        raise CodeStoreError(f"permission denied listing {base}{prefix}: your account needs storage.objects.list on "
                             f"bucket {bucket!r} (e.g. roles/storage.objectViewer); Cloud Storage said: "
                             f"{_said(exc)}") from None
    except gexc.NotFound:
        raise CodeStoreError(f"bucket {bucket!r} of the job's checkpoint_uri does not exist") from None
    except (gexc.GoogleAPIError, RefreshError, DefaultCredentialsError, TransportError, OSError) as exc:
        raise CodeStoreError(f"listing {base}{prefix} failed: {exc}; {LOGIN_HINT} if it is about credentials, "
                             "else retry") from None


def log_attempts(base: str, project: str | None = None) -> list[int]:
    """The attempts that have logs below `base`: its folders, listed with a delimiter (one entry per attempt)."""
    where = StoreUri.parse(base)
    if where.local_path is not None:
        try:
            names = os.listdir(where.local_path)
        except FileNotFoundError:
            return []
    else:
        under = where.path
        try:
            pages = _log_client(project).list_blobs(where.bucket, prefix=under, delimiter="/", **CALL)
            for _ in pages:
                pass  # the prefixes are known once every page was read
            names = [p[len(under):].rstrip("/") for p in pages.prefixes]
        except UNANSWERED:
            raise CodeStoreError(_unanswered()) from None
        except (gexc.GoogleAPIError, RefreshError, DefaultCredentialsError, TransportError, OSError) as exc:
            raise CodeStoreError(f"listing {base} failed: {exc}") from None
    return sorted(int(n) for n in names if n.isdigit())


def read_log(base: str, name: str, project: str | None = None) -> bytes:
    """The object `name` below `base`. Raises CodeStoreError."""
    where = StoreUri.parse(base)
    if where.local_path is not None:
        try:
            with open(os.path.join(where.local_path, name), "rb") as f:
                return f.read()
        except OSError as exc:
            raise CodeStoreError(f"cannot read {base}{name}: {exc.strerror}") from None
    bucket = where.bucket
    try:
        return _log_client(project).bucket(bucket).blob(where.path + name).download_as_bytes(**CALL)
    except UNANSWERED:
        raise CodeStoreError(_unanswered()) from None
    except gexc.Forbidden as exc:
        raise CodeStoreError(f"permission denied reading {base}{name}: your account needs storage.objects.get on "
                             f"bucket {bucket!r} (e.g. roles/storage.objectViewer); Cloud Storage said: "
                             f"{_said(exc)}") from None
    except (gexc.GoogleAPIError, RefreshError, DefaultCredentialsError, TransportError, OSError) as exc:
        raise CodeStoreError(f"reading {base}{name} failed: {exc}; retry") from None
