"""Restore from a peer: a step committed in the checkpoint store, its bytes read from a survivor's copy on its own
disk, served by that node's agent (node_agent/peers.py), over the job's network instead of from Cloud Storage.

The checkpoint store stays the truth: the step must be committed there, and its marker and manifest come from
there (storage load_step_from); the peer serves only the data files and the skeleton, read with the same ranged,
hashed read as the store's (fmt.load_from: ranges on parallel keep-alive connections straight into the arrays, the
ranges' checksums joined per file). A peer's byte that does not match the store's manifest, a missing file, a
refused or slow connection: the restore reads the step from the store instead, as if no peer had been named.
The peers are contract.ENV_PEERS, read at each restore (a process that rejoins a new generation gets new ones).
"""

from __future__ import annotations

import http.client
import os
import threading
from typing import Any, Callable

from respawn import contract

from . import _log, format as fmt

CONNECT_TIMEOUT_S = 2.0  # a peer that does not answer at once is gone (its VM, or its route): the store it is
READ_TIMEOUT_S = 20.0  # a peer that stops sending mid-range: the store reads the step again from the start
WORKERS = 8  # connections per peer, as the store's ranged reads (storage.UPLOAD_WORKERS)


def from_env(environ=os.environ) -> list[tuple[str, int]]:
    """The peers named in contract.ENV_PEERS; a malformed value names none (logged)."""
    try:
        return contract.parse_peers(environ.get(contract.ENV_PEERS, ""))
    except ValueError as exc:
        _log.warning("ignoring the peers the node agent named; restoring from the checkpoint store", error=str(exc))
        return []


class PeerError(Exception):
    """A peer could not serve a file or a range as the manifest says (any status but the one asked for)."""


class PeerSource:
    """One step on a peer's agent: read(name) for small files, fill(range, algorithm, sink) for data files, one
    keep-alive connection per reading thread."""

    def __init__(self, host: str, port: int, step: int) -> None:
        self.host, self.port = host, port
        self.base = f"/{fmt.step_dirname(step)}/"
        self._local = threading.local()
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return f"peer {contract.peer_endpoint(self.host, self.port)}"

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S)
            conn.connect()
            conn.sock.settimeout(READ_TIMEOUT_S)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _get(self, name: str, want: int, headers: dict) -> http.client.HTTPResponse:
        conn = self._connection()
        conn.request("GET", self.base + name, headers=headers)
        response = conn.getresponse()
        if response.status != want:
            body = response.read()[:200].decode(errors="replace")
            raise PeerError(f"{self} answered HTTP {response.status} for {self.base}{name} ({body.strip()})")
        return response

    def read(self, name: str) -> bytes:
        return self._get(name, 200, {}).read()

    def fill(self, r: fmt.Range, algorithm: str, sink=None) -> int:
        what = f"{self} {r.name} bytes {r.start}-{r.end - 1}"
        response = self._get(r.name, 206, {"Range": f"bytes={r.start}-{r.end - 1}"})
        if response.getheader("Content-Length") != str(r.end - r.start):
            raise PeerError(f"{what}: {response.getheader('Content-Length')} bytes, not {r.end - r.start}")
        return fmt.fill(response, r.views, algorithm, what, None if sink is None else sink.writer(r.name, r.start))

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()


def load(peers: list[tuple[str, int]], store, step: int, copy_to: str | None,
         check: Callable[[dict], None], like: Any = None) -> tuple[dict, Any, str] | None:
    """(manifest, state, source) of `step`, committed in `store`, read from the first peer that serves all of it
    as the store's manifest says; None when none did (each failure logged): the caller reads the store."""
    for host, port in peers:
        source = PeerSource(host, port, step)
        try:
            manifest, state = store.load_step_from(source, step, copy_to, check, WORKERS, like)
        except fmt.NotRestorable:
            raise  # the step's layout, not the peer: the store's copy is the same
        except Exception as exc:  # noqa: BLE001 - any failure of a peer: the next one, then the store
            _log.warning("a peer could not serve the checkpoint; reading it from the checkpoint store", step=step,
                         peer=str(source), store=store.uri, reason=f"{type(exc).__name__}: {exc}")
            continue
        finally:
            source.close()
        return manifest, state, str(source)
    return None
