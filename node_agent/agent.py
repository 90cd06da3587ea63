"""The node agent: start (or adopt) the trainer, heartbeat, and answer the first notice.

Life of one agent:
1. Heartbeat `starting`; the watchers and the SIGTERM handler are live from here on.
2. Decide about the trainer from trainer.json (see supervisor.py):
   - it is still running (the agent was restarted): adopt it, never start a second one;
   - it ended while no agent was watching (same boot, no notice): report how it ended, start nothing;
   - otherwise (first start, a reboot, a restart in place after a notice): upload checkpoints a previous life
     left on the local disk, then start the trainer.
3. Heartbeat `training` every `heartbeat_seconds` with the trainer's step and newest committed checkpoint.
4. The first of: a notice (instance/preempted TRUE, instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE,
   SIGTERM/SIGINT to the agent) → SIGTERM to the trainer's process group at once, `preempting` (written in the
   background), wait for the trainer to finish its emergency checkpoint and exit, or for the deadline (notice
   + notice_budget_seconds; then SIGKILL), final heartbeat `exited` with the committed step, exit 0;
   or the trainer exits on its own → final heartbeat `exited` with its exit code (and the tail of its output if
   it failed), exit 0 — what to do next is the controller's decision;
   or SIGHUP → leave the trainer running and exit EXIT_AGENT_DETACH so that systemd restarts the agent, which
   adopts it.
"""

from __future__ import annotations

import os
import platform
import signal
import threading
import time
from datetime import datetime, timezone

from respawn import contract
from respawn.contract import Heartbeat, NodeState
from respawn.logs import log

from .config import AgentConfig
from .firestore_rest import FirestoreWriter
from .heartbeat import Heartbeater, compose_heartbeat
from .metadata import MetadataClient
from .previous_life import upload_previous_life
from .supervisor import LOG_FILE, OutputForwarder, TrainerProcess, TrainerRecord, boot_id, read_exit_file
from .watcher import NOTICE_SIGTERM, Watcher, maintenance_watch, preempted_watch

# After the notice budget, this long is left to write the final heartbeat (a Spot VM gets 30 s in all).
FINAL_WRITE_GRACE_S = 3.0
PREEMPTING_WRITE_S = 3.0
FIRST_READ_WAIT_S = 10.0


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Agent:
    def __init__(self, cfg: AgentConfig, md: MetadataClient, writer: FirestoreWriter, *,
                 final_report_seconds: float = 300.0, upload_timeout_seconds: float = 900.0):
        self.cfg, self.md = cfg, md
        self.settings = cfg.settings
        self.final_report_seconds = final_report_seconds
        self.upload_timeout_seconds = upload_timeout_seconds
        self.node_dir = cfg.node_dir
        self.status_path = os.path.join(self.node_dir, contract.STATUS_FILE)
        self.local_ckpt_dir = os.path.join(self.node_dir, contract.LOCAL_CHECKPOINT_DIR)
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self.notice: str | None = None
        self.notice_at = 0.0
        self.detach = False
        self.state = NodeState.STARTING
        self.started_at = datetime.now(timezone.utc)
        self.exit_code: int | None = None
        self.output_tail: str | None = None
        self.trainer: TrainerProcess | None = None
        self.forwarder: OutputForwarder | None = None
        self.heartbeater = Heartbeater(writer, cfg.node, self.snapshot, interval=self.settings.heartbeat_seconds)
        self.watchers = [
            Watcher(md, w, self.on_notice, wait_seconds=self.settings.metadata_wait_seconds)
            for w in (preempted_watch(), maintenance_watch())
        ]

    # --- inputs -------------------------------------------------------------------------------------------

    def on_notice(self, notice: str, detail: str = "") -> None:
        """Called by the watchers and the signal handler; the first notice wins."""
        with self._lock:
            if self.notice is None:
                self.notice, self.notice_at = notice, time.monotonic()
        self.wake.set()

    def on_detach(self) -> None:
        self.detach = True
        self.wake.set()

    def snapshot(self) -> Heartbeat:
        return compose_heartbeat(
            job_id=self.cfg.job_id, attempt=self.cfg.attempt, zone=self.cfg.zone, state=self.state,
            status=contract.read_status(self.status_path), started_at=self.started_at, notice=self.notice,
            exit_code=self.exit_code, output_tail=self.output_tail,
        )

    # --- the life ------------------------------------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.local_ckpt_dir, exist_ok=True)
        log("INFO", "node agent starting", node=self.cfg.node, job_id=self.cfg.job_id, attempt=self.cfg.attempt,
            zone=self.cfg.zone, node_dir=self.node_dir, metadata=self.md.host, pid=os.getpid(),
            python=platform.python_version())
        self.heartbeater.start()
        for w in self.watchers:
            w.start()
        ended_before = self._take_over_or_start()
        if ended_before is not None:
            return self._report_exit(ended_before[1])
        while True:
            if self.notice is not None:
                return self._handle_notice()
            if self.detach:
                return self._detach()
            if self.trainer is not None:
                ended, code = self.trainer.poll()
                if ended:
                    return self._report_exit(code)
            self.wake.wait(0.5)
            self.wake.clear()

    def _take_over_or_start(self) -> tuple[bool, int | None] | None:
        """Adopt or start the trainer. Returns (True, exit status) if it ended while no agent was watching."""
        record = TrainerRecord.load(self.node_dir)
        if record is not None and (record.job_id, record.attempt) != (self.cfg.job_id, self.cfg.attempt):
            log("WARNING", "trainer record belongs to another job or attempt; ignoring it",
                record_job=record.job_id, record_attempt=record.attempt)
            record = None
        if record is not None and record.alive():
            log("INFO", "adopting the trainer a previous agent started", pid=record.pid, started_at=record.started_at)
            # Its earlier output was forwarded by the previous agent already: follow from the current end.
            self._attach(TrainerProcess(self.node_dir, record, child=None),
                         forward_from=_size(os.path.join(self.node_dir, LOG_FILE)))
            return None
        if record is not None and record.boot_id == boot_id() and record.notice is None:
            code = read_exit_file(self.node_dir)
            log("WARNING", "the trainer ended while no agent was watching; reporting it, starting nothing",
                pid=record.pid, exit_code=code)
            self.started_at = datetime.fromisoformat(record.started_at)
            self.trainer = TrainerProcess(self.node_dir, record, child=None)
            return True, code
        # A node flagged before the agent looked must not start a trainer: wait for the first reads (bounded, in
        # case the metadata server is down; the watchers keep trying in the background).
        deadline = time.monotonic() + FIRST_READ_WAIT_S
        for w in self.watchers:
            w.first_answer.wait(max(0.0, deadline - time.monotonic()))
        if self.notice is not None:
            return None
        upload_previous_life(self.local_ckpt_dir, self.settings.checkpoint_uri,
                             timeout=self.upload_timeout_seconds, interrupted=lambda: self.notice is not None)
        if self.notice is not None:
            return None  # the notice came first: start nothing, just report
        started_at = _iso_now()
        trainer = TrainerProcess.start(self.node_dir, self.settings.command, self._trainer_env(),
                                       job_id=self.cfg.job_id, attempt=self.cfg.attempt, started_at=started_at)
        self._attach(trainer)
        return None

    def _attach(self, trainer: TrainerProcess, forward_from: int | None = None) -> None:
        self.trainer = trainer
        self.started_at = datetime.fromisoformat(trainer.record.started_at)
        offset = trainer.record.log_offset if forward_from is None else forward_from
        self.forwarder = OutputForwarder(os.path.join(self.node_dir, LOG_FILE), offset)
        self.forwarder.start()
        self.state = NodeState.TRAINING

    def _trainer_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")  # the output log should follow the trainer live
        env.update(self.settings.env)
        env.update({
            contract.ENV_JOB_ID: self.cfg.job_id,
            contract.ENV_ATTEMPT: str(self.cfg.attempt),
            contract.ENV_CHECKPOINT_URI: self.settings.checkpoint_uri,
            contract.ENV_LOCAL_CHECKPOINT_DIR: self.local_ckpt_dir,
            contract.ENV_STATUS_FILE: self.status_path,
            contract.ENV_NOTICE_BUDGET: f"{self.settings.notice_budget_seconds:g}",
        })
        return env

    # --- endings -------------------------------------------------------------------------------------------

    def _handle_notice(self) -> int:
        deadline = self.notice_at + self.settings.notice_budget_seconds
        trainer = self.trainer
        running = trainer is not None and not trainer.poll()[0]
        log("WARNING", "notice: telling the trainer to save an emergency checkpoint", notice=self.notice,
            trainer_pid=trainer.pid if trainer else None, budget_s=self.settings.notice_budget_seconds)
        if trainer is not None:
            if running:
                trainer.signal(signal.SIGTERM)
            trainer.record.notice = self.notice
            trainer.record.save(self.node_dir)
        self.state = NodeState.PREEMPTING
        self.heartbeater.stop_periodic()
        preempting = threading.Thread(
            target=self.heartbeater.write_until, name="preempting-heartbeat",
            args=(self.snapshot, min(deadline, time.monotonic() + PREEMPTING_WRITE_S)),
            kwargs={"what": "preempting"}, daemon=True,
        )
        preempting.start()
        code = self._wait_for_trainer(deadline) if running else (trainer.poll()[1] if trainer else None)
        self.exit_code = code
        if code not in (0, contract.EXIT_PREEMPTED) and trainer is not None:
            self.output_tail = trainer.output_tail()
        self.state = NodeState.EXITED
        status = contract.read_status(self.status_path) or {}
        preempting.join(max(0.0, deadline - time.monotonic()))
        written = self.heartbeater.write_until(self.snapshot, deadline + FINAL_WRITE_GRACE_S, what="final")
        self._stop_forwarding()
        log("WARNING" if written else "ERROR", "notice handled; agent exiting", notice=self.notice,
            exit_code=code, committed_step=status.get("committed_step"), emergency=status.get("emergency"),
            final_heartbeat_written=written, seconds_since_notice=round(time.monotonic() - self.notice_at, 2))
        return 0

    def _wait_for_trainer(self, deadline: float) -> int | None:
        assert self.trainer is not None
        seen = None
        while time.monotonic() < deadline:
            ended, code = self.trainer.poll()
            if ended:
                return code
            emergency = (contract.read_status(self.status_path) or {}).get("emergency")
            state = emergency.get("state") if isinstance(emergency, dict) else None
            if state != seen and state not in (None, "idle"):
                log("INFO", "emergency checkpoint", state=state, step=emergency.get("step"),
                    reason=emergency.get("reason"))
                seen = state
            time.sleep(0.05)
        log("ERROR", "the trainer did not exit within the notice budget; killing its process group",
            pid=self.trainer.pid, budget_s=self.settings.notice_budget_seconds)
        self.trainer.signal(signal.SIGKILL)
        self.trainer.wait(2.0)
        return self.trainer.poll()[1]

    def _report_exit(self, code: int | None) -> int:
        self.exit_code = code
        if code != 0 and self.trainer is not None:
            self.output_tail = self.trainer.output_tail()
        self.state = NodeState.EXITED
        self._stop_forwarding()
        if code == 0:
            log("INFO", "trainer finished successfully", exit_code=0)
        else:
            log("ERROR", "trainer exited with an error; the controller decides what happens next", exit_code=code,
                output_tail=self.output_tail)
        self.heartbeater.stop_periodic()
        written = self.heartbeater.write_until(self.snapshot, time.monotonic() + self.final_report_seconds,
                                               what="final")
        if not written:
            # Keep trainer.json: the next agent (systemd restarts a failed one) reports this exit again.
            return 1
        TrainerRecord.clear(self.node_dir)
        return 0

    def _detach(self) -> int:
        log("INFO", "SIGHUP: agent exiting, trainer left running for the next agent to adopt",
            trainer_pid=self.trainer.pid if self.trainer else None)
        self.heartbeater.stop_periodic()
        self._stop_forwarding()
        return contract.EXIT_AGENT_DETACH

    def _stop_forwarding(self) -> None:
        if self.forwarder is not None:
            self.forwarder.stop()
            self.forwarder.join(2.0)


def install_signal_handlers(agent: Agent) -> None:
    signal.signal(signal.SIGTERM, lambda *_: agent.on_notice(NOTICE_SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: agent.on_notice(NOTICE_SIGTERM))
    signal.signal(signal.SIGHUP, lambda *_: agent.on_detach())
