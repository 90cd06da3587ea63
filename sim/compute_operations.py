"""Compute Engine zone operations: what an insert, start, stop, delete or setMetadata answers, and the system
events' (systemevent-…). An operation is RUNNING until its service ends it (finish), DONE then, with the error a
refusal puts inside it; zoneOperations.get, wait (until DONE or the timeout) and list read them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from sim.compute_instance import BASE, match_filter
from sim.core import compute_found, rfc3339
from sim.runtime import SimRuntime


@dataclass
class Operation:
    zone: str
    body: dict
    done: threading.Event = field(default_factory=threading.Event)


class ZoneOperations:
    def __init__(self, rt: SimRuntime, new_id: Callable[[], str]) -> None:
        self.rt = rt
        self._new_id = new_id
        self.operations: dict[tuple[str, str], Operation] = {}

    def new(self, zone: str, op_type: str, target: str, target_id: str, *, system: bool = False) -> Operation:
        now = time.time()
        name = (f"systemevent-{int(now * 1000)}-" if system else "operation-") + f"{int(now * 1000)}-{self._new_id()[:8]}"
        op = Operation(zone, {
            "kind": "compute#operation", "id": self._new_id(), "name": name,
            "zone": f"{BASE}/projects/{self.rt.project}/zones/{zone}",
            "operationType": op_type, "targetLink": f"{BASE}/{target}", "targetId": target_id,
            "status": "RUNNING", "user": "system" if system else "respawn@sim", "progress": 0,
            "insertTime": rfc3339(now), "startTime": rfc3339(now),
            "selfLink": f"{BASE}/projects/{self.rt.project}/zones/{zone}/operations/{name}",
        })
        self.operations[(zone, name)] = op
        return op

    def finish(self, op: Operation | None, error: dict | None = None, http: tuple[int, str] | None = None) -> None:
        """End the operation (None: a step Compute takes on its own, with no operation of the caller's to end)."""
        if op is None:
            return
        with self.rt.cond:
            op.body.update(status="DONE", progress=100, endTime=rfc3339())
            if error:
                op.body["error"] = {"errors": [error]}
                op.body["httpErrorStatusCode"], op.body["httpErrorMessage"] = http
            op.done.set()
            self.rt.cond.notify_all()

    def get(self, zone: str, name: str) -> dict:
        with self.rt.cond:
            path = f"projects/{self.rt.project}/zones/{zone}/operations/{name}"
            return dict(compute_found(self.operations, (zone, name), path).body)

    def wait(self, zone: str, name: str, timeout: float = 120) -> dict:
        self.get(zone, name)
        op = self.operations[(zone, name)]
        op.done.wait(timeout)
        return self.get(zone, name)

    def list(self, zone: str, filter_text: str | None) -> dict:
        with self.rt.cond:
            items = [dict(o.body) for (z, _), o in self.operations.items() if z == zone]
        if filter_text:
            items = [i for i in items if match_filter(i, filter_text)]
        return {"kind": "compute#operationList", "items": items,
                "selfLink": f"{BASE}/projects/{self.rt.project}/zones/{zone}/operations"}
