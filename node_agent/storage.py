"""Download one object — the user's workdir archive, the respawn wheel — to a local file, checking its sha256.

gs://BUCKET/OBJECT: the Cloud Storage JSON API, `GET {host}/storage/v1/b/BUCKET/o/OBJECT?alt=media` with the VM's
service-account token from the metadata server; host = RESPAWN_STORAGE_HOST, else STORAGE_EMULATOR_HOST (local
runs), else https://storage.googleapis.com. file:///PATH: a copy (the local stand-ins). The standard library only,
streamed in 1 MiB chunks (never the whole object in memory), no proxies (as the rest of the agent).

Transient trouble (connection errors, timeouts, 429, 5xx) is retried with backoff for `retry_seconds`; what
retrying cannot fix (404, 403, other 4xx) raises FetchError at once, its message naming the object and what to do.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import time
from typing import BinaryIO, Callable
from urllib.parse import quote, urlsplit

from respawn.logs import log

from .metadata import TRANSPORT_ERRORS, MetadataClient, MetadataError, ServiceAccountToken, TokenError

PRODUCTION_HOST = "https://storage.googleapis.com"
CHUNK = 1 << 20


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


def split_gs(uri: str) -> tuple[str, str]:
    bucket, _, name = uri[len("gs://"):].partition("/")
    if not bucket or not name:
        raise FetchError(f"{uri} is not gs://BUCKET/OBJECT")
    return bucket, name


def http_failure(uri: str, status: int, body: str, *, missing_hint: str, account: str | None) -> FetchError:
    """What an HTTP error status means for `uri`, and what to do about it."""
    bucket = uri[len("gs://"):].split("/", 1)[0] if uri.startswith("gs://") else "?"
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
        if uri.startswith("file:///"):
            return self._copy(uri, dest, missing_hint, interrupted)
        if not uri.startswith("gs://"):
            raise FetchError(f"{uri}: only gs:// and file:/// URIs can be downloaded")
        bucket, name = split_gs(uri)
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

    def _copy(self, uri: str, dest: str, missing_hint: str, interrupted: Callable[[], bool]) -> tuple[int, str]:
        path = uri[len("file://"):]
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
