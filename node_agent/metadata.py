"""The Compute Engine metadata server, found the way google-auth finds it.

GCE_METADATA_HOST (host[:port]) wins, then the older GCE_METADATA_ROOT, then metadata.google.internal. Every
request carries `Metadata-Flavor: Google`.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from urllib.parse import quote, urlencode

from . import _http

DEFAULT_HOST = "metadata.google.internal"
HEADERS = {"Metadata-Flavor": "Google"}


def metadata_host(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("GCE_METADATA_HOST") or env.get("GCE_METADATA_ROOT") or DEFAULT_HOST


class MetadataError(Exception):
    """The server answered, but not with 200. `status` is the HTTP status (404: no such key)."""

    def __init__(self, path: str, status: int, body: str):
        self.path, self.status = path, status
        super().__init__(f"metadata server answered HTTP {status} for {path}: {body.strip()[:200]}")


# What a transport failure looks like: refused/dropped connections, timeouts, garbled answers.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


class MetadataClient:
    def __init__(self, host: str | None = None):
        self.host = host or metadata_host()
        self.root = f"http://{self.host}/computeMetadata/v1/"

    def read(self, path: str, *, timeout: float = 5.0) -> tuple[str, str | None]:
        """(value, etag) of one key. Raises MetadataError on an HTTP error, TRANSPORT_ERRORS on a dead link."""
        return self._get(path, {}, timeout)

    def wait_for_change(self, path: str, last_etag: str, *, wait_seconds: float) -> tuple[str, str | None]:
        """Hanging GET: returns when the value's ETag differs from `last_etag` (at once if it already does), or
        after `wait_seconds` with the current value. The socket timeout leaves the server room to answer."""
        params = {"wait_for_change": "true", "last_etag": last_etag, "timeout_sec": str(int(max(1, wait_seconds)))}
        return self._get(path, params, timeout=wait_seconds + 10)

    def _get(self, path: str, params: dict[str, str], timeout: float) -> tuple[str, str | None]:
        url = self.root + quote(path.lstrip("/")) + (f"?{urlencode(params)}" if params else "")
        resp = _http.request("GET", url, headers=HEADERS, timeout=timeout)
        if resp.status != 200:
            raise MetadataError(path, resp.status, resp.text())
        return resp.text(), resp.headers.get("etag")


class TokenError(Exception):
    """No access token for the VM's service account (no service account attached, or the server is down)."""


class ServiceAccountToken:
    """An access token for the VM's default service account (`instance/service-accounts/default/token`), kept until
    a minute before it expires. Shared by the Firestore heartbeat and the Cloud Storage downloads."""

    def __init__(self, md: MetadataClient):
        self.md = md
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() > self._expires - 60:
                try:
                    body, _ = self.md.read("instance/service-accounts/default/token")
                    data = json.loads(body)
                    token = data["access_token"]
                except (MetadataError, ValueError, KeyError, TypeError) as exc:
                    raise TokenError(f"no access token from the metadata server {self.md.host}: {exc}; the VM "
                                     "needs a service account (the control plane attaches the node service "
                                     "account)") from None
                self._token = token
                self._expires = time.monotonic() + float(data.get("expires_in", 300))
            return self._token
