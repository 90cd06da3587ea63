"""A flex-start node's end, known in advance (respawn.contract.ATTR_RUN_SECONDS: the VM's run duration in seconds,
counted from the VM's start; a reservation-bound node's, ATTR_RUN_ENDS_AT, is a wall-clock time taken the same way). At the end Compute Engine stops or deletes the VM without a preemption notice
(instance/preempted never turns TRUE; docs/gcp-facts.md §18), so the agent gives itself one: at the run's end −
the notice budget − RUN_END_MARGIN_S it acts as on instance/preempted, with the notice kind NOTICE_RUN_ENDING.

The VM's start is taken as the guest's boot: the seconds since it are CLOCK_BOOTTIME (the kernel's clock since boot,
counting a suspend too, unmoved by the wall clock). A start/stop flex-start VM gets a new run at each start
(§18), which is a new boot, so the count starts again with it. The kernel boots a few seconds after the VM turns
RUNNING, so the end computed this way is late by those seconds: the margin covers them.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from respawn.logs import log

# Acting this long before the run's end, besides the notice budget: the guest's boot comes after the VM turned
# RUNNING, when the run started (firmware and kernel: seconds to a few tens of seconds), and after the budget the
# final heartbeat still needs writing (agent.FINAL_WRITE_GRACE_S); what is left is slack, so that the save never
# races the deletion.
RUN_END_MARGIN_S = 60.0
# The sim's nodes share the host's kernel, whose boot is not theirs: the sim may say when the simulated VM started
# (seconds since the epoch). A real node never sets it.
ENV_BOOT_TIME = "RESPAWN_BOOT_TIME"
BOOT_CLOCK = "CLOCK_BOOTTIME"


def seconds_since_boot() -> tuple[float, str]:
    """(seconds since the VM's start as the guest sees it, where that came from)."""
    override = os.environ.get(ENV_BOOT_TIME, "").strip()
    if override:
        try:
            return time.time() - float(override), ENV_BOOT_TIME
        except ValueError:
            log("WARNING", f"{ENV_BOOT_TIME} is not a number of seconds since the epoch; using the kernel's boot "
                           "clock", value=override)
    return time.clock_gettime(time.CLOCK_BOOTTIME), BOOT_CLOCK


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


@dataclass(frozen=True)
class RunEnd:
    """When to act on the run's end, from what the agent knew at one moment (`uptime` seconds after the VM's start,
    `wall` its wall-clock time, `mono` its monotonic time)."""

    run_seconds: int
    budget: float  # settings.notice_budget_seconds
    uptime: float
    source: str  # BOOT_CLOCK or ENV_BOOT_TIME
    wall: float
    mono: float

    @classmethod
    def now(cls, run_seconds: int | None, budget: float, ends_at: float | None = None) -> "RunEnd":
        """`run_seconds` from the VM's start (a flex-start run) and/or `ends_at`, a wall-clock end (a reservation-
        bound VM's, whatever its boots since): the earlier."""
        uptime, source = seconds_since_boot()
        wall = time.time()
        ends = [s for s in (run_seconds, None if ends_at is None else round(ends_at - (wall - uptime))) if s is not None]
        return cls(min(ends), budget, uptime, source, wall, time.monotonic())

    @property
    def act_in(self) -> float:
        """Seconds from the computation to the moment to act; ≤ 0: act at once."""
        return self.run_seconds - self.uptime - self.budget - RUN_END_MARGIN_S

    @property
    def act_at(self) -> float:
        """The moment to act, monotonic."""
        return self.mono + self.act_in

    def seconds_to_end(self) -> float:
        """From now to the run's end as computed (late by the kernel's start after RUNNING)."""
        return self.run_seconds - self.uptime - (time.monotonic() - self.mono)

    def describe(self) -> dict:
        """The log line's fields: when the run ends and when the agent acts, and how that was computed."""
        boot = self.wall - self.uptime
        return {"run_seconds": self.run_seconds, "boot_at": _iso(boot), "boot_from": self.source,
                "run_ends_at": _iso(boot + self.run_seconds),
                "acts_at": _iso(self.wall + max(0.0, self.act_in)),
                "acts_in_s": round(max(0.0, self.act_in), 1), "notice_budget_s": self.budget,
                "margin_s": RUN_END_MARGIN_S, "formula": "boot + run_seconds - notice_budget_s - margin_s"}


class RunEndTimer(threading.Thread):
    """Calls `on_due()` once at RunEnd.act_at; a daemon thread, it ends with the agent."""

    def __init__(self, plan: RunEnd, on_due: Callable[[], None]):
        super().__init__(name="run-end", daemon=True)
        self.plan, self.on_due = plan, on_due

    def run(self) -> None:
        while True:
            left = self.plan.act_at - time.monotonic()
            if left <= 0:
                self.on_due()
                return
            time.sleep(left)
