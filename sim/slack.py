"""A Slack incoming-webhook receiver on 127.0.0.1: records every JSON payload and answers `ok` (HTTP 200), as
Slack does; `fail(status, count)` makes it answer errors for fault tests (429 with Retry-After, 500 rollup_error,
404 channel_not_found, ...).

    with SlackReceiver() as slack:
        slack.url                         # give it to the code as SLACK_WEBHOOK_URL
        slack.fail(429, count=2, retry_after=1)
        slack.payloads                    # every payload received, failed ones included (see .requests)
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

from sim.loopback_http import LoopbackHTTPServer

ERROR_BODIES = {400: "invalid_payload", 403: "action_prohibited", 404: "channel_not_found", 410: "channel_is_archived",
                429: "rate_limited", 500: "rollup_error", 503: "service_unavailable"}


class SlackReceiver:
    def __init__(self) -> None:
        self.requests: list[dict] = []  # {"payload", "status"} for every POST, in order
        self._lock = threading.Lock()
        self._fail_status: int | None = None
        self._fail_count = 0  # -1 = until cleared
        self._retry_after = 1
        self._server: LoopbackHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._delivered = threading.Condition(self._lock)

    @property
    def payloads(self) -> list[dict]:
        """Payloads answered `ok`."""
        with self._lock:
            return [r["payload"] for r in self.requests if r["status"] == 200]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/services/T000/B000/sim"

    def fail(self, status: int = 500, count: int = -1, retry_after: int = 1) -> None:
        """Answer the next `count` posts (-1: all until `recover()`) with `status`."""
        with self._lock:
            self._fail_status, self._fail_count, self._retry_after = status, count, retry_after

    def forget(self) -> None:
        """Drop what was received so far (the demo's record holds its job's alerts, not its self-test's message)."""
        with self._lock:
            self.requests.clear()

    def recover(self) -> None:
        with self._lock:
            self._fail_status, self._fail_count = None, 0

    def wait_for(self, n: int, timeout: float = 30) -> list[dict]:
        """Block until `n` payloads were answered `ok`; returns them (raises TimeoutError otherwise)."""
        with self._delivered:
            ok = self._delivered.wait_for(lambda: sum(r["status"] == 200 for r in self.requests) >= n, timeout)
        if not ok:
            raise TimeoutError(f"the Slack receiver got {len(self.payloads)} payload(s) within {timeout} s, not {n}")
        return self.payloads

    def _answer(self) -> tuple[int, str, dict]:
        with self._lock:
            if self._fail_status is not None and self._fail_count != 0:
                if self._fail_count > 0:
                    self._fail_count -= 1
                status = self._fail_status
                headers = {"Retry-After": str(self._retry_after)} if status == 429 else {}
                return status, ERROR_BODIES.get(status, "error"), headers
        return 200, "ok", {}

    def start(self) -> "SlackReceiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(raw)
                    status, body, headers = receiver._answer()
                except json.JSONDecodeError:
                    payload, status, body, headers = raw.decode(errors="replace"), 400, "invalid_payload", {}
                with receiver._delivered:
                    receiver.requests.append({"payload": payload, "status": status})
                    receiver._delivered.notify_all()
                data = body.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = LoopbackHTTPServer(0, Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="slack-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)

    def __enter__(self) -> "SlackReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
