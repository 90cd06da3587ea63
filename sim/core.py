"""Shared pieces of the simulated cloud: API errors in Google's JSON shapes, a delayed-action scheduler, and the
record of every node's lifetime (what `respawn demo` draws and what tests check for double provisioning)."""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone


class SimError(Exception):
    """A control-surface call that cannot apply (unknown node, wrong state)."""


class ApiError(Exception):
    """An HTTP error answer of the simulated API, with the JSON body the real API sends."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(body.get("error", {}).get("message", str(status)))
        self.status = status
        self.body = body


def compute_error(status: int, reason: str, message: str) -> ApiError:
    """Compute Engine's error body: `error.errors[].reason` is what google-api-core exposes as `.errors`."""
    return ApiError(status, {"error": {"code": status, "message": message,
                                       "errors": [{"message": message, "domain": "global", "reason": reason}]}})


GRPC_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
               429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def rpc_error(status: int, message: str, grpc_status: str | None = None) -> ApiError:
    """The google.rpc.Status-style body of the Cloud TPU API (`grpc_status`: another than the HTTP code's usual one,
    e.g. FAILED_PRECONDITION, which is HTTP 400 too)."""
    return ApiError(status, {"error": {"code": status, "message": message,
                                       "status": grpc_status or GRPC_STATUS.get(status, "UNKNOWN")}})


def compute_found(table: dict, key: tuple, path: str):
    """table[key], or Compute Engine's 404 notFound naming `path`."""
    item = table.get(key)
    if item is None:
        raise compute_error(404, "notFound", f"The resource '{path}' was not found")
    return item


def found(table: dict, zone: str, name: str, path: str):
    """table[(zone, name)], or the Cloud TPU API's 404 naming `path`."""
    item = table.get((zone, name))
    if item is None:
        raise rpc_error(404, f"Resource '{path}' was not found")
    return item


def rfc3339(t: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if t is None else t, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Scheduler:
    """Runs callables after a delay on one background thread, in due order."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sim-scheduler", daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn, *args) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), fn, args))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                if self._stopped:
                    return
                _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception as exc:  # a failing step must not stop the clock for every other node
                import sys
                print(f"sim: scheduled step {getattr(fn, '__name__', fn)} failed: {exc!r}", file=sys.stderr)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify_all()
        self._thread.join(timeout=5)


@dataclass
class NodeRecord:
    """One node's life. Times are seconds on the sim clock. `live` lists [start, end] periods during which the
    node held its accelerator (end None = still live)."""

    kind: str  # "instance" (Compute) or "tpu"
    zone: str
    name: str
    labels: dict
    accelerator_type: str
    provisioning_model: str
    created_at: float
    deleted_at: float | None = None
    states: list = field(default_factory=list)  # [(t, state)]
    live: list = field(default_factory=list)  # [[start, end|None]]
    boots: int = 0

    def transition(self, t: float, state: str, live: bool) -> None:
        self.states.append((t, state))
        is_live = bool(self.live) and self.live[-1][1] is None
        if live and not is_live:
            self.live.append([t, None])
        elif not live and is_live:
            self.live[-1][1] = t

    def deleted(self, t: float) -> None:
        """The node is gone for good at `t`."""
        self.transition(t, "DELETED", False)
        self.deleted_at = t

    def as_dict(self) -> dict:
        return {
            "kind": self.kind, "zone": self.zone, "name": self.name, "labels": dict(self.labels),
            "acceleratorType": self.accelerator_type, "provisioningModel": self.provisioning_model,
            "createdAt": self.created_at, "deletedAt": self.deleted_at, "boots": self.boots,
            "states": [list(s) for s in self.states], "live": [list(p) for p in self.live],
        }


MAX_HOSTS = 254  # the VMs of one node (a TPU slice's workers): NodeAddresses' last octet


class NodeAddresses:
    """The one place a sim VM's IP address is made: loopback addresses (all of 127/8 reaches this machine on Linux),
    distinct per node and per host of a node, so that a master (torchrun, JAX's coordinator) can bind and its peers
    connect by the address the API lists. Numbered from a random start: two sims on one machine give their nodes
    different addresses, so their masters' fixed ports do not meet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = random.SystemRandom().randrange(62_500)

    def take(self, hosts: int = 1) -> list[str]:
        """The addresses of a new node's `hosts` VMs (host 0 first)."""
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"the sim gives a node 1..{MAX_HOSTS} hosts, not {hosts}")
        with self._lock:
            self._next += 1
            n = self._next
        return [str(ipaddress.IPv4Address(f"127.{1 + n // 250 % 250}.{1 + n % 250}.{h + 1}")) for h in range(hosts)]
