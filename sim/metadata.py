"""A Compute Engine metadata server for one simulated node, on 127.0.0.1.

Serves `/computeMetadata/v1/...` the way the real server does where our code depends on it:
- every request must carry `Metadata-Flavor: Google` (else 403), every answer carries it back;
- `instance/preempted` (FALSE/TRUE), `instance/maintenance-event` (NONE/...), `instance/name`, `instance/id`,
  `instance/zone` (`projects/NUMBER/zones/ZONE`), `instance/network-interfaces/0/ip` (the node's address),
  `instance/attributes/*`, `project/project-id`, and a default service-account token so google-auth's compute
  credentials work;
- directories (`instance/attributes/`) list their keys, and `?recursive=true` answers JSON;
- each value has an ETag; `?wait_for_change=true` blocks until the value changes, returns at once when
  `last_etag` differs from the current ETag, and returns the current value after `timeout_sec` seconds.

The node agent finds it through `GCE_METADATA_HOST=127.0.0.1:PORT`, as google-auth does.
Faults for flapping tests: `fail_next(n, status)` answers HTTP errors, `drop_next(n)` closes connections
without an answer.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from sim.loopback_http import LoopbackHTTPServer

PREFIX = "/computeMetadata/v1/"
# The real server caps a hanging GET; without timeout_sec we cap it too, so no request waits forever.
MAX_WAIT_SECONDS = 3600.0


def _etag(value: str, version: int) -> str:
    return hashlib.sha1(f"{version}:{value}".encode()).hexdigest()[:16]


class MetadataServer:
    """One node's metadata server. `start()` binds `bind` (127.0.0.1) on a free port; `.host` is "BIND:PORT"."""

    def __init__(
        self,
        *,
        name: str = "node",
        zone: str = "us-central1-a",
        project: str = "respawn-test",
        project_number: str = "123456789012",
        instance_id: str = "1000000000000000001",
        attributes: dict[str, str] | None = None,
        machine_type: str = "n1-standard-4",
        address: str = "127.0.0.1",
        bind: str = "127.0.0.1",
    ) -> None:
        self.bind = bind  # the sim's netns mode binds the nodes' bridge address (sim/netns.py)
        self._cond = threading.Condition()
        self._values: dict[str, tuple[str, str]] = {}  # path -> (value, etag)
        self._version = 0
        self._stopped = False
        self._fail: list[int] = []  # HTTP statuses to answer, one per request
        self._drop = 0
        self.requests: list[str] = []  # paths asked for, in order (for assertions)
        self._server: LoopbackHTTPServer | None = None
        self._thread: threading.Thread | None = None
        base = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/name": name,
            "instance/hostname": f"{name}.{zone}.c.{project}.internal",
            "instance/network-interfaces/0/ip": address,  # the API's networkInterfaces[0].networkIP
            "instance/id": instance_id,
            "instance/zone": f"projects/{project_number}/zones/{zone}",
            "instance/machine-type": f"projects/{project_number}/machineTypes/{machine_type}",
            "instance/service-accounts/default/email": f"{project_number}-compute@developer.gserviceaccount.com",
            "instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform",
            "project/project-id": project,
            "project/numeric-project-id": project_number,
        }
        for path, value in base.items():
            self.set(path, value)
        for key, value in (attributes or {}).items():
            self.set(f"instance/attributes/{key}", value)

    # --- control -------------------------------------------------------------------------------------------

    def set(self, path: str, value: str) -> None:
        """Set a value, e.g. set("instance/preempted", "TRUE"); wakes every hanging GET on it."""
        path = path.strip("/")
        with self._cond:
            current = self._values.get(path)
            if current is not None and current[0] == value:
                return
            self._version += 1
            self._values[path] = (str(value), _etag(str(value), self._version))
            self._cond.notify_all()

    def get(self, path: str) -> str | None:
        with self._cond:
            item = self._values.get(path.strip("/"))
            return None if item is None else item[0]

    def delete(self, path: str) -> None:
        with self._cond:
            if self._values.pop(path.strip("/"), None) is not None:
                self._version += 1
                self._cond.notify_all()

    def set_attribute(self, key: str, value: str) -> None:
        self.set(f"instance/attributes/{key}", value)

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next `n` requests with HTTP `status` (the real server answers 503 during maintenance)."""
        with self._cond:
            self._fail.extend([status] * n)

    def drop_next(self, n: int) -> None:
        """Close the connection without any answer for the next `n` requests."""
        with self._cond:
            self._drop += n

    @property
    def host(self) -> str:
        if self._server is None:
            raise RuntimeError("the metadata server is not started: call start() first")
        return f"{self.bind}:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}{PREFIX}"

    def start(self) -> "MetadataServer":
        handler = _make_handler(self)
        self._server = LoopbackHTTPServer(0, handler, self.bind)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"metadata-{self.host}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)

    def __enter__(self) -> "MetadataServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- request handling (called from handler threads) -------------------------------------------------------

    def _take_fault(self) -> tuple[str, int] | None:
        with self._cond:
            if self._drop > 0:
                self._drop -= 1
                return ("drop", 0)
            if self._fail:
                return ("fail", self._fail.pop(0))
        return None

    def _children(self, directory: str) -> dict[str, str]:
        prefix = directory.rstrip("/") + "/" if directory else ""
        return {p[len(prefix):]: v for p, (v, _) in self._values.items() if p.startswith(prefix)}

    def _lookup(self, path: str, recursive: bool) -> tuple[str, str, str] | None:
        """(body, etag, content-type) for a path, or None. Directories end with '/' or hold children."""
        with self._cond:
            leaf = self._values.get(path.rstrip("/")) if not path.endswith("/") else None
            if leaf is not None:
                return leaf[0], leaf[1], "application/text"
            children = self._children(path.rstrip("/"))
            if not children:
                return None
            if recursive:
                tree: dict = {}
                for rel, value in sorted(children.items()):
                    node = tree
                    parts = rel.split("/")
                    for part in parts[:-1]:
                        node = node.setdefault(_camel(part), {})
                    # attribute keys are user keys: keep them as they are
                    node[parts[-1] if "attributes" in path else _camel(parts[-1])] = value
                body = json.dumps(tree)
                ctype = "application/json"
            else:
                names = sorted({rel.split("/")[0] + ("/" if "/" in rel else "") for rel in children})
                body = "".join(f"{n}\n" for n in names)
                ctype = "application/text"
            return body, _etag(body, 0), ctype

    def _wait(self, path: str, recursive: bool, last_etag: str | None, timeout: float) -> tuple[str, str, str] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            first = self._lookup(path, recursive)
            if first is None:
                return None
            start_etag = last_etag if last_etag not in (None, "", "0") else first[1]
            if first[1] != start_etag:
                return first
            while not self._stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
                now = self._lookup(path, recursive)
                if now is None or now[1] != start_etag:
                    return now
            return self._lookup(path, recursive)


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(p.capitalize() for p in rest)


def _make_handler(server: MetadataServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # keep test output clean; requests are recorded in .requests
            pass

        def _send(self, status: int, body: str, ctype: str = "application/text", etag: str | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            if etag:
                self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            fault = server._take_fault()
            if fault and fault[0] == "drop":
                self.close_connection = True
                return
            if fault:
                self._send(fault[1], "Service Unavailable" if fault[1] == 503 else "error")
                return
            url = urlsplit(self.path)
            server.requests.append(url.path)
            if url.path in ("", "/"):
                # google-auth's ping: only the header matters
                self._send(200, "computeMetadata/\n")
                return
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor:Google header.\n", "text/html")
                return
            if not url.path.startswith(PREFIX):
                self._send(404, "Not Found\n", "text/html")
                return
            path = url.path[len(PREFIX):]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            recursive = query.get("recursive", "").lower() == "true"
            if path == "instance/service-accounts/default/token":
                token = {"access_token": "sim-token", "expires_in": 3599, "token_type": "Bearer"}
                self._send(200, json.dumps(token), "application/json")
                return
            if query.get("wait_for_change", "").lower() == "true":
                timeout = float(query.get("timeout_sec", MAX_WAIT_SECONDS))
                found = server._wait(path, recursive, query.get("last_etag"), timeout)
            else:
                found = server._lookup(path, recursive)
            if found is None:
                self._send(404, "Not Found\n", "text/html")
                return
            body, etag, ctype = found
            if query.get("alt") == "json" and ctype != "application/json":
                body, ctype = json.dumps(body), "application/json"
            self._send(200, body, ctype, etag)

    return Handler
