"""The notice: how this node learns it is going away, and the agent's own signals.

The first of these is the node's notice (`kind`), and the deadline of the emergency save is its time + the notice
budget: instance/preempted TRUE, instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE (watcher.py), a flex-start
node's run nearing its end (run_end.py: NOTICE_RUN_ENDING), SIGTERM/SIGINT to the agent. A notice other than SIGTERM
is told to the controller at once (contract.notice_nudge), which may create the replacement during the notice; a
SIGTERM alone may be a user's stop. A SIGTERM after a metadata notice is the soft-off, the notice's second moment
(JobSpec.notice_seconds after the first): the save then has the budget's rest after it. SIGHUP (`detached`) is no
notice: the agent leaves the trainer running for the next agent to adopt.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Callable

from respawn import contract
from respawn.contract import NodeState
from respawn.logs import log

from .config import AgentConfig
from .metadata import MetadataClient
from .nudge import Nudger
from .run_end import RunEnd, RunEndTimer
from .signal_safe import SignalSafeEvent
from .watcher import NOTICE_SIGTERM, Watcher, maintenance_watch, preempted_watch

FIRST_READ_WAIT_S = 10.0  # how long a node waits for the watchers' first reads before it starts anything


class Notice:
    """`kind` (None until the first notice) and `at` (monotonic) of the node's notice, `soft_off_at`, `detached`.
    `on_notice` and `on_detach` are called from the watchers' threads, the run-end timer and the signal handlers;
    each sets `wake`, the agent's main loop's event. What they lock is re-entrant, for the handlers (SignalSafeEvent):
    one may run while the main thread holds it (in on_notice itself, for a SIGTERM that came before the agent)."""

    def __init__(self, cfg: AgentConfig, md: MetadataClient, nudger: Nudger | None, wake: SignalSafeEvent):
        self.cfg, self.settings = cfg, cfg.settings
        self.kind: str | None = None
        self.at = 0.0
        self.soft_off_at: float | None = None  # a SIGTERM after a metadata notice (monotonic)
        self.detached = False
        self._nudger, self._wake = nudger, wake
        self._lock = threading.RLock()
        self._told = False  # the controller was sent this node's notice
        self._telling: threading.Thread | None = None  # that message's publish
        self._run = "flex-start run"  # what a run with a known end is, in the agent's log lines (watch_run_end)
        self._watchers = [Watcher(md, w, self.on_notice, wait_seconds=self.settings.metadata_wait_seconds)
                          for w in (preempted_watch(), maintenance_watch())]

    def start(self) -> None:
        for w in self._watchers:
            w.start()

    def await_first_reads(self) -> None:
        """A node flagged before the agent looked must not start a trainer: wait for the watchers' first reads
        (bounded, in case the metadata server is down; they keep trying in the background)."""
        deadline = time.monotonic() + FIRST_READ_WAIT_S
        for w in self._watchers:
            w.first_answer.wait(max(0.0, deadline - time.monotonic()))

    def on_notice(self, kind: str, detail: str = "") -> None:
        """The first notice wins. A metadata notice or the run's end is told to the controller once (whichever
        came first); a SIGTERM after one is the soft-off."""
        with self._lock:
            if self.kind is None:
                self.kind, self.at = kind, time.monotonic()
            elif kind == NOTICE_SIGTERM and self.kind != NOTICE_SIGTERM and self.soft_off_at is None:
                self.soft_off_at = time.monotonic()
            tell = kind != NOTICE_SIGTERM and not self._told
            self._told = self._told or tell
        if tell and self._nudger is not None:
            self._telling = self._nudger.nudge(f"{kind} notice", message=contract.notice_nudge(
                self.cfg.job_id, self.cfg.node, kind, datetime.now(timezone.utc).isoformat()))
        self._wake.set()

    def on_detach(self) -> None:
        self.detached = True
        self._wake.set()

    def interrupted(self) -> bool:
        """A notice or SIGHUP came: nothing new is started."""
        return self.kind is not None or self.detached

    @property
    def deadline(self) -> float:
        """When the emergency save must be over (monotonic): the notice + the notice budget."""
        return self.at + self.settings.notice_budget_seconds

    def save_deadline(self, deadline: float) -> float:
        """`deadline`, or earlier when the soft-off came: then the save has the budget's rest after it."""
        if self.soft_off_at is None:
            return deadline
        return min(deadline, self.soft_off_at + self.settings.notice_budget_seconds - self.settings.notice_seconds)

    def told(self, seconds: float) -> None:
        """Wait up to `seconds` for the controller's message about this notice to be out (a quick save must not
        end the agent before it is)."""
        if self._telling is not None:
            self._telling.join(seconds)

    def watch_run_end(self, state: Callable[[], NodeState], done: Callable[[], bool]) -> None:
        """A flex-start node (ATTR_RUN_SECONDS) or a reservation-bound one (ATTR_RUN_ENDS_AT): act on its run's end
        in time (run_end.py); at once when that time has passed already (an agent started late in the run), before
        anything is started. `done`: the trainer ended the node's life; `state`: the node's."""
        if self.cfg.run_seconds is None and self.cfg.run_ends_at is None:
            return
        plan = RunEnd.now(self.cfg.run_seconds, self.settings.notice_budget_seconds, self.cfg.run_ends_at)
        self._run = "flex-start run" if self.cfg.run_seconds is not None else "reservation-bound run"
        log("INFO", f"{self._run}: its end is known; the trainer saves and stops before it", **plan.describe())
        if plan.act_in <= 0:
            self._on_run_end(plan, state, done)
        else:
            RunEndTimer(plan, lambda: self._on_run_end(plan, state, done)).start()

    def _on_run_end(self, plan: RunEnd, state: Callable[[], NodeState], done: Callable[[], bool]) -> None:
        """The run's end is near: a notice (NOTICE_RUN_ENDING), unless another came first or nothing is left to
        save: a failed preparation (the heartbeat keeps saying so) or a trainer that ended its job (reported, the
        agent exits)."""
        finished = done()
        if self.kind is not None or finished or state() in (NodeState.SETUP_FAILED, NodeState.EXITED):
            log("INFO", f"{self._run}: its end is near; nothing to save", notice=self.kind,
                state=state().value, seconds_to_end=round(plan.seconds_to_end(), 1))
            return
        log("WARNING", f"{self._run}: its end is near; acting as on a preemption notice",
            notice=contract.NOTICE_RUN_ENDING, seconds_to_end=round(plan.seconds_to_end(), 1),
            budget_s=self.settings.notice_budget_seconds)
        self.on_notice(contract.NOTICE_RUN_ENDING)
