"""One small HTTP helper on http.client, shared by the metadata and Firestore clients.

http.client instead of requests keeps the agent's resident memory low (requests alone adds about 17 MB), and a
fresh connection per request is what the metadata watcher wants anyway: a dropped connection is simply retried.
Proxies are not used: the metadata server must never be reached through one.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def request(method: str, url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 10.0) -> Response:
    """Send one request and read the whole answer. Raises OSError (incl. TimeoutError, ConnectionError) and
    http.client.HTTPException on transport failures; HTTP error statuses are returned, not raised."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        import ssl  # only the real Firestore endpoint needs TLS; the metadata server and the emulator do not

        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.netloc, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()
