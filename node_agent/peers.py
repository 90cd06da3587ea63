"""A multi-node member's committed checkpoints, served read-only to the job's other nodes (issue #25: a replacement
restores from a survivor instead of Cloud Storage when the survivor holds the newest committed step).

    GET /step_000000000042/data-00000.bin        Range: bytes=0-33554431   → 206 and those bytes

Only a committed step is served (contract.committed_files: its directory holds the marker, written last), and only
the files its manifest lists; anything else (an uncommitted or unknown step, the manifest or marker themselves, any other path) is 404. No
path is ever joined from what the request says: the step directory must match contract.CHECKPOINT_STEP_RE and the
file must be a name the manifest lists, so nothing outside the checkpoint directory can be named. The reader checks
every byte against the manifest it reads from the checkpoint store, never this node's (respawn.ckpt.peers), so a
stale or torn local copy costs the reader a fallback to the store, nothing more.

Bound to the node's own address (metadata instance/network-interfaces/0/ip) on contract.PEER_PORT
(ENV_PEER_PORT in the agent's environment moves it); the job's firewall rule admits only its own nodes. Files go
out with sendfile; one thread per connection (the reader keeps one keep-alive connection per worker).
"""

from __future__ import annotations

import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from respawn import contract
from respawn.logs import log

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
SEND_CHUNK = 8 << 20


def listen_port(environ=os.environ) -> int:
    """The port this node's agent serves on: contract.PEER_PORT unless the agent's environment moves it."""
    text = environ.get(contract.ENV_PEER_PORT, "")
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else contract.PEER_PORT


def peers_env(generation: contract.Generation, node: str, port: int) -> dict:
    """ENV_PEERS for this node's trainer in `generation`: the master's agent for every other member, none for the
    master. The master is the survivor that holds the newest committed step: in a job of replicated state rank 0
    (on the master) alone writes checkpoints to its disk, a master that still serves stays master
    (membership.form_generation), and a new master keeps on its disk the step it restores before the other ranks
    read it (TorchJob.restore). So no other member is worth asking, and the generation needs no more addresses."""
    ask = generation.members[0] != node
    return {contract.ENV_PEERS: contract.peer_endpoint(generation.master_addr, port) if ask else ""}


def committed_file(root: str, path: str) -> str | None:
    """The file a request path names under checkpoint directory `root`: /STEP/NAME where STEP is a committed
    step's directory and NAME a file its manifest lists; None for anything else."""
    parts = urlsplit(path).path.split("/")
    if len(parts) != 3 or parts[0] != "" or not contract.CHECKPOINT_STEP_RE.match(parts[1]):
        return None
    step_dir, name = os.path.join(root, parts[1]), parts[2]
    files = contract.committed_files(step_dir)
    if files is None or name not in files or name in ("", ".", "..") or "/" in name or "\0" in name:
        return None
    return os.path.join(step_dir, name)


class PeerServer:
    """Serves `root` (the node's LOCAL_CHECKPOINT_DIR) at address:port on a thread of its own."""

    def __init__(self, root: str, address: str, port: int) -> None:
        self.root = root
        self._served: set[tuple[str, str]] = set()  # (client, step) already logged
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((address, port), _handler(self))
        self.httpd.daemon_threads = True
        self.address, self.port = self.httpd.server_address[:2]

    def start(self) -> "PeerServer":
        threading.Thread(target=self.httpd.serve_forever, name="peer-checkpoints", daemon=True).start()
        log("INFO", "serving committed checkpoints to the job's other nodes", address=self.address, port=self.port,
            dir=self.root)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _first(self, client: str, step: str) -> bool:
        with self._lock:
            new = (client, step) not in self._served
            self._served.add((client, step))
        return new


def _handler(server: PeerServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the reader sends every range of a worker on one connection

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name; one line per step
            pass

        def do_GET(self) -> None:
            path = committed_file(server.root, self.path)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW) if path is not None else None
            except OSError:  # retention removed it meanwhile
                fd = None
            if fd is None:
                self._answer(404, "not a file of a committed step on this node")
                return
            try:
                size = os.fstat(fd).st_size
                start, end = 0, size
                header = self.headers.get("Range")
                if header is not None:
                    m = _RANGE.match(header.strip())
                    if m is None:
                        self._answer(400, "only one range, bytes=START-[END], is served")
                        return
                    start, end = int(m.group(1)), min(size, int(m.group(2)) + 1 if m.group(2) else size)
                    if start >= end:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                step = self.path.split("/")[1]
                if server._first(self.client_address[0], step):
                    log("INFO", "serving a committed step to a peer", peer=self.client_address[0], step=step,
                        dir=server.root)
                self.send_response(206 if header is not None else 200)
                if header is not None:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(end - start))
                self.end_headers()
                offset = start
                while offset < end:
                    sent = os.sendfile(self.connection.fileno(), fd, offset, min(SEND_CHUNK, end - offset))
                    if sent == 0:
                        break  # the file shrank under us: the reader sees a short body and falls back
                    offset += sent
            finally:
                os.close(fd)

        def _answer(self, status: int, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def serve(root: str, address: str | None, environ=os.environ) -> PeerServer | None:
    """Start serving `root` on the node's address, or None (logged) when there is no address or the port is
    taken: the job's replacements then read from the checkpoint store, as without this server."""
    port = listen_port(environ)
    if not address:
        log("WARNING", "the metadata server gave no network address: not serving checkpoints to peers (a replacement "
                       "reads them from the checkpoint store)")
        return None
    try:
        return PeerServer(root, address, port).start()
    except OSError as exc:
        log("WARNING", "cannot serve checkpoints to peers (a replacement reads them from the checkpoint store); set "
                       f"{contract.ENV_PEER_PORT} to a free port", address=address, port=port, error=str(exc))
        return None
