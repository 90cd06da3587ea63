"""The HTTP server every sim endpoint uses: loopback (or, for a node's metadata server in the sim's netns mode, the
nodes' bridge address, which only this machine's namespaces reach), a thread per request, quiet about clients that
hang up (an agent that times out a hanging GET, a process killed by a preemption)."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class LoopbackHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, handler, host: str = "127.0.0.1") -> None:
        super().__init__((host, port), handler)

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)
