"""The trainer's lifecycle as the agent drives it: start it or adopt the one a previous agent started, follow its
output, stop it within a deadline, and keep how it ended (its exit status and the tail of its output) for the
heartbeat. The process itself, its record (trainer.json) and its wrapper are supervisor.py's.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from typing import Any

from respawn import contract
from respawn.logs import log

from .notice import Notice
from .save_outcome import node_outcome
from .supervisor import LOG_FILE, OutputForwarder, TrainerProcess, TrainerRecord


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class TrainerLife:
    """The node's trainer (`process`: None before one starts and between generations), when it started
    (`started_at`: the agent's own start until then) and how the last one ended (`exit_code`, `output_tail`)."""

    def __init__(self, node_dir: str, notice: Notice, *, job_id: str, attempt: int):
        self.node_dir, self.notice = node_dir, notice
        self.job_id, self.attempt = job_id, attempt
        self.status_path = os.path.join(node_dir, contract.STATUS_FILE)
        self.process: TrainerProcess | None = None
        self.started_at = datetime.now(timezone.utc)
        self.exit_code: int | None = None
        self.output_tail: str | None = None
        self._forwarder: OutputForwarder | None = None
        self._notified = self._killed = False  # this run was given the notice; killed at its deadline

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None, **record: Any) -> None:
        """A new trainer (`record`: its generation and members, for trainer.json)."""
        self.exit_code = self.output_tail = None
        self._notified = self._killed = False
        self._attach(TrainerProcess.start(self.node_dir, argv, env, job_id=self.job_id, attempt=self.attempt,
                                          started_at=datetime.now(timezone.utc).isoformat(), cwd=cwd, **record))

    def adopt(self, record: TrainerRecord) -> None:
        """The running trainer a previous agent started. Its earlier output was forwarded by that agent already:
        follow from the current end."""
        self._attach(TrainerProcess(self.node_dir, record, child=None),
                     forward_from=_size(os.path.join(self.node_dir, LOG_FILE)))

    def ended_unwatched(self, record: TrainerRecord) -> int | None:
        """The trainer of `record` ended while no agent watched: its exit status, read as any exit is (its exit
        file; supervisor.finished_anyway)."""
        self.process = TrainerProcess(self.node_dir, record, child=None)
        self.started_at = datetime.fromisoformat(record.started_at)
        return self.process.poll()[1]

    def _attach(self, trainer: TrainerProcess, forward_from: int | None = None) -> None:
        self.process = trainer
        self.started_at = datetime.fromisoformat(trainer.record.started_at)
        offset = trainer.record.log_offset if forward_from is None else forward_from
        self._forwarder = OutputForwarder(os.path.join(self.node_dir, LOG_FILE), offset)
        self._forwarder.start()

    def poll(self) -> tuple[bool, int | None]:
        """(ended, exit status) of the trainer; (False, None) when there is none."""
        return self.process.poll() if self.process is not None else (False, None)

    def running(self) -> bool:
        return self.process is not None and not self.process.poll()[0]

    def ended(self, code: int | None, *, tail_unless: tuple = (0, contract.EXIT_PREEMPTED)) -> None:
        """Keep how the trainer ended: `code`, and the tail of its output unless `code` is in `tail_unless`."""
        self.exit_code = code
        if code not in tail_unless and self.process is not None:
            self.output_tail = self.process.output_tail()

    def noticed(self, kind: str | None) -> None:
        """Tell the trainer to save (TrainerProcess.notify, if it still runs) and record the notice in trainer.json:
        a restarted agent does not read its end as one nobody watched."""
        if self.process is None:
            return
        if not self.process.poll()[0]:
            self.process.notify()
            self._notified = True
        self.process.record.notice = kind
        self.process.record.save(self.node_dir)

    def emergency(self, status: dict[str, Any] | None) -> dict[str, Any] | None:
        """The emergency save's outcome for the heartbeat once this run was given the notice (save_outcome.py: the
        run's and each rank's); None before: the status file's says it."""
        if not self._notified:
            return None
        ended = self.process is None or self.process.poll()[0]
        return node_outcome(status, contract.read_savers(os.path.join(self.node_dir, contract.NOTICE_DIR)),
                            ended=ended, exit_code=self.exit_code, killed=self._killed)

    def joined(self, generation: int, members: list[str]) -> None:
        """The trainer rejoined `generation` in its process: trainer.json says so."""
        assert self.process is not None
        self.process.record.generation, self.process.record.members = generation, members
        self.process.record.save(self.node_dir)

    def release(self) -> None:
        """The trainer ended and the node waits for the next one: nothing left to follow or to adopt."""
        self.stop_forwarding()
        self.process = None
        TrainerRecord.clear(self.node_dir)

    def wait(self, deadline: float, why: str | None = None) -> int | None:
        """The trainer's exit status once it exits, or after `deadline` (earlier after the soft-off:
        Notice.save_deadline) once its process group is killed (`why`: the log line saying so; by default, the
        notice budget's)."""
        trainer = self.process
        assert trainer is not None
        seen = None
        soft_off_seen = False
        while time.monotonic() < self.notice.save_deadline(deadline):
            if self.notice.soft_off_at is not None and not soft_off_seen:
                soft_off_seen = True
                log("WARNING", "soft-off: the VM powers off soon; the emergency save must end by then",
                    seconds_since_notice=round(self.notice.soft_off_at - self.notice.at, 2),
                    seconds_left=round(self.notice.save_deadline(deadline) - time.monotonic(), 2))
            ended, code = trainer.poll()
            if ended:
                return code
            emergency = (contract.read_status(self.status_path) or {}).get("emergency")
            state = emergency.get("state") if isinstance(emergency, dict) else None
            if state != seen and state not in (None, "idle"):
                log("INFO", "emergency checkpoint", state=state, step=emergency.get("step"),
                    reason=emergency.get("reason"))
                seen = state
            time.sleep(0.05)
        if why is None:
            log("ERROR", "the trainer did not exit within the notice budget; killing its process group",
                pid=trainer.pid, budget_s=self.notice.settings.notice_budget_seconds)
        else:
            log("WARNING", why, pid=trainer.pid)
        trainer.kill()
        self._killed = True
        trainer.wait(2.0)
        return trainer.poll()[1]

    def stop_forwarding(self) -> None:
        if self._forwarder is not None:
            self._forwarder.stop()
            self._forwarder.join(2.0)
