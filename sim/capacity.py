"""Capacity and quota as timelines: a zone can stock out at one moment and recover at another.

A timeline maps (scope, accelerator type, provisioning model) to a list of (at, limit) steps, where `at` is seconds
on the sim clock (seconds since the SimServer started) and `limit` is how many nodes may hold that hardware at once
(None = unlimited). The limit in force at time t is the last step with at <= t; with no step, it is unlimited.

Capacity is per zone (hardware in use: instances PROVISIONING..STOPPING, TPU nodes CREATING/READY/DELETING).
Quota is per region (as on Google Cloud), and a preempted TPU node keeps holding it until it is deleted.
A step set for a provisioning model ("SPOT", "STANDARD" or, for capacity, "FLEX_START") overrides the step set for
all models (None), so a test can stock out Spot while on-demand or flex-start stays available. Flex-start VMs have
capacity of their own but the preemptible quota: their quota steps are the "SPOT" ones (sim.compute.quota_model).
A PENDING flex-start VM holds neither. "RESERVATION" steps are the size of the zone's specific reservation (the
sim holds one per zone and accelerator, sim/compute_capacity.py): VMs consuming it count against them alone, and no step in
the zone means it has none; they are charged to no quota (the reservation holds it).
"""

from __future__ import annotations

import bisect
import threading

Key = tuple[str, str, "str | None"]


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


class Timeline:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[Key, list[tuple[float, int | None]]] = {}

    def set(self, scope: str, accelerator_type: str, limit: int | None, at: float,
            provisioning_model: str | None = None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"a limit must be None (unlimited) or >= 0, not {limit}")
        key = (scope, accelerator_type, provisioning_model)
        with self._lock:
            steps = self._steps.setdefault(key, [])
            steps[:] = [s for s in steps if s[0] != at]
            bisect.insort(steps, (at, limit), key=lambda s: s[0])

    def limit(self, scope: str, accelerator_type: str, provisioning_model: str | None, t: float) -> tuple[int | None, bool]:
        """(limit at time t, whether the limit is specific to `provisioning_model`)."""
        with self._lock:
            for key, specific in (((scope, accelerator_type, provisioning_model), True), ((scope, accelerator_type, None), False)):
                if key[2] is None and specific:
                    continue
                steps = self._steps.get(key)
                if not steps:
                    continue
                i = bisect.bisect_right([s[0] for s in steps], t)
                if i == 0:
                    continue
                return steps[i - 1][1], specific
        return None, False

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [
                {"scope": k[0], "acceleratorType": k[1], "provisioningModel": k[2], "at": at, "limit": limit}
                for k, steps in sorted(self._steps.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or ""))
                for at, limit in steps
            ]
