"""The node agent: start (or adopt) the trainer, heartbeat, and answer the first notice.

Life of one agent:
1. Heartbeat `starting`; the watchers and the SIGTERM handler are live from here on.
2. Decide about the trainer from trainer.json (see supervisor.py):
   - it is still running (the agent was restarted): adopt it, never start a second one;
   - it ended while no agent was watching (same boot, no notice): report how it ended, start nothing;
   - otherwise (first start, a reboot, a restart in place after a notice): heartbeat `preparing`; fetch the
     workdir, install the library into the trainer's interpreter, upload checkpoints a previous life left on the
     local disk, run setup (prepare.py) or restore its result from the environment cache (envcache.py); then
     start the trainer in the workdir (a node created during its predecessor's notice first waits for that one's
     final heartbeat: ATTR_HANDOVER), and upload what setup produced to the cache in the background. A
     preparation that fails → `setup-failed` (failed_command, exit_code, output_tail), no trainer, and the agent
     stays up heartbeating it until a notice (prepare.failed.json: an agent restarted in the same boot reports it
     again, never reruns it).
3. Heartbeat `training` every `heartbeat_seconds` with the trainer's step and newest committed checkpoint.
4. The first of: a notice (instance/preempted TRUE, instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE,
   a flex-start node's run nearing its end (run_end.py: kind run-ending), SIGTERM/SIGINT to the agent) → SIGTERM
   to the trainer's process group at once, `preempting` (written in the background), wait for the trainer to
   finish its emergency checkpoint and exit, or for the deadline (notice + notice_budget_seconds; then SIGKILL),
   final heartbeat `exited` with the committed step, exit 0. A notice other than SIGTERM is also published to the
   controller at once (contract.notice_nudge), which may create the replacement during the notice. A SIGTERM
   after a metadata notice is the soft-off, the notice's second moment (with
   JobSpec.notice_seconds, that long after the first): the deadline becomes the soft-off + the budget's rest;
   or the trainer exits on its own → final heartbeat `exited` with its exit code (and the tail of its output if
   it failed), exit 0 — what to do next is the controller's decision;
   or SIGHUP → leave the trainer running and exit EXIT_AGENT_DETACH so that systemd restarts the agent, which
   adopts it.
A trainer that ends on its own — any exit but a stop on the notice (contract.EXITS_ON_NOTICE) with no notice: an
error, or 0 (done: the nodes go now) — or a failed setup wakes the controller once its heartbeat has landed
(nudge.py: one message to the sweep topic), so that it acts now, not at its next scheduled sweep; a multi-node
member's peers wait for it in their collectives.
"""

from __future__ import annotations

import os
import platform
import signal
import threading
import time

from respawn import contract
from respawn.contract import Heartbeat, NodeState
from respawn.logs import labels, log

from . import next_generation
from .cloudlog import CloudLog
from .config import AgentConfig
from .firestore_rest import FirestoreWriter
from .handover import Handovers
from .heartbeat import Heartbeater, compose_heartbeat
from .lifecycle import TrainerLife
from .logship import LogShipper
from .membership import Membership, join
from .metadata import MetadataClient
from .notice import Notice
from .nudge import PUBLISH_TIMEOUT_S, Nudger
from .preparation import Preparation
from .prepare import PrepareFailed
from .reach import Progress
from .signal_safe import SignalSafeEvent
from .storage import Uploader
from .supervisor import TrainerRecord, boot_id
from .watcher import NOTICE_SIGTERM

# After the notice budget, this long is left to write the final heartbeat (a Spot VM gets 30 s in all).
FINAL_WRITE_GRACE_S = 3.0
PREEMPTING_WRITE_S = 3.0
DETACH_LOG_SEND_S = 10.0  # SIGHUP: how long a log send in flight may take to finish before the agent exits
SETUP_FAILED_WRITE_S = 30.0  # the first setup-failed write; the periodic heartbeat keeps writing it afterwards
# How long the controller's wake-up (nudge.py) waits for the heartbeat that reports the failure to land first; it is
# sent after this even if none did. An agent about to exit waits this long at most for it to be sent.
NUDGE_AFTER_BEAT_S = 60.0
NUDGE_SEND_S = 2 * PUBLISH_TIMEOUT_S + 1  # the token from the metadata server, then the publish
# The logs' last chunk after the trainer's own end (its report is written first): the node stays until the controller
# deletes it, which it does only after reading that report.
LOG_EXIT_FLUSH_S = 30.0


class Agent:
    """Orchestrates the node's parts: the notice (notice.py), the generation it trains in (membership.py) and the
    trainer's move into a newer one (next_generation.py), the handovers before a trainer starts (handover.py), the
    preparation (preparation.py), the trainer's lifecycle (lifecycle.py), the heartbeat (heartbeat.py; its progress
    fields, reach.py), the log shipping (logship.py) and the controller's wake-up (nudge.py). What it owns itself is
    the node's `state`, which every heartbeat says."""

    def __init__(self, cfg: AgentConfig, md: MetadataClient, writer: FirestoreWriter,
                 membership: Membership | None = None, *,
                 final_report_seconds: float = 300.0, upload_timeout_seconds: float = 900.0):
        self.cfg, self.md, self.settings = cfg, md, cfg.settings
        self.final_report_seconds = final_report_seconds
        self.status_path = os.path.join(cfg.node_dir, contract.STATUS_FILE)
        self.wake = SignalSafeEvent()  # the main loop's: set by every input (a notice, SIGHUP, a generation)
        self.state = NodeState.STARTING
        # Each worker of a multi-host slice beats to a document of its own; worker 0's is nodes/{node}, as before.
        self.heartbeater = Heartbeater(writer, contract.heartbeat_id(cfg.node, cfg.worker), self.snapshot,
                                       interval=self.settings.heartbeat_seconds)
        # The node's logs, shipped to the job's checkpoint_uri as they grow (logship.py): they outlive the node.
        # Each chunk also becomes labelled Cloud Logging entries where the job asks for it (cloudlog.py).
        cloud = (CloudLog(cfg.project, cfg.zone or "", md, labels)
                 if self.settings.cloud_logging else None)
        self.logs = LogShipper(Uploader(md), self.settings.checkpoint_uri, cfg.node_dir, job_id=cfg.job_id,
                               attempt=cfg.attempt, host=contract.heartbeat_id(cfg.node, cfg.worker), cloud=cloud)
        # Wakes the controller when this node fails on its own (a trainer's error exit, a failed setup): without it
        # the controller learns of a failure that loses no VM only at its next scheduled sweep.
        self.nudger = (Nudger(cfg.project, self.settings.sweep_topic, cfg.job_id, md)
                       if self.settings.sweep_topic else None)
        self.notice = Notice(cfg, md, self.nudger, self.wake)
        # The generation the trainer runs in: a one-node job's one, or a multi-node job's, which change.
        self.membership = membership if membership is not None else join(cfg, md)
        self.handovers = Handovers(cfg, writer, self.notice.interrupted)
        self.preparation = Preparation(cfg, md, self.notice, upload_timeout_seconds=upload_timeout_seconds,
                                       on_change=self.heartbeater.nudge)
        self.life = TrainerLife(cfg.node_dir, self.notice, job_id=cfg.job_id, attempt=cfg.attempt)
        # The trainer's first step ends a recovery (respawn.control.recovery_time): told now rather than at the next
        # sweep, before the job may end or lose this node again.
        self.progress = Progress(lambda: self._wake_controller("the trainer's first step", time.monotonic()))

    # --- inputs -------------------------------------------------------------------------------------------

    def on_notice(self, notice: str, detail: str = "") -> None:
        """Called by the signal handler (and main, for a SIGTERM before the agent existed)."""
        self.notice.on_notice(notice, detail)

    def on_detach(self) -> None:
        self.notice.on_detach()

    # --- the heartbeat -------------------------------------------------------------------------------------

    def snapshot(self) -> Heartbeat:
        # A failed setup stays the node's outcome when a notice follows (the node being deleted for it): the
        # controller must not read the notice as a preemption and replace the node to fail the same way again.
        failed, training = self.state is NodeState.SETUP_FAILED, self.state is NodeState.TRAINING
        failure, life, cache = self.preparation.failure, self.life, self.preparation.env_cache
        status = contract.read_status(self.status_path)
        return compose_heartbeat(
            job_id=self.cfg.job_id, attempt=self.cfg.attempt, zone=self.cfg.zone, state=self.state,
            status=status, started_at=life.started_at, notice=None if failed else self.notice.kind,
            exit_code=failure.exit_code if failure is not None else life.exit_code,
            output_tail=failure.output_tail if failure is not None else life.output_tail,
            failed_command=failure.command if failure is not None else None, worker=self.cfg.worker,
            env_cache=cache.status if cache is not None else None, emergency=life.emergency(status),
            # step_idle_seconds and the first step (reach.py); the generation and master_reachable (membership.py).
            **self.progress.beat(training, (life.started_at, self.membership.running), status, life.started_at),
            **self.membership.beat(training),
        )

    # --- the life ------------------------------------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.preparation.local_ckpt_dir, exist_ok=True)
        log("INFO", "node agent starting", node=self.cfg.node, job_id=self.cfg.job_id, attempt=self.cfg.attempt,
            worker=self.cfg.worker, workers=self.cfg.hosts.count, master_addr=self.cfg.hosts.master_addr,
            zone=self.cfg.zone, node_dir=self.cfg.node_dir, metadata=self.md.host, pid=os.getpid(),
            python=platform.python_version())
        self.heartbeater.start()
        self.logs.start()
        self.notice.start()
        self.membership.start(self.wake)
        ended_before = self._take_over_or_prepare()
        if ended_before is not None:
            return self._report_exit(ended_before[1])
        while True:
            if self.notice.kind is not None:
                if self.state is NodeState.SETUP_FAILED:
                    return self._end_after_setup_failure()
                return self._handle_notice()
            if self.notice.detached:
                return self._detach()
            if self.life.process is not None:
                ended, code = self.life.poll()
                if ended and self.membership.ends_life(code):
                    return self._report_exit(code)
                if ended:
                    self._between_generations(code, on_its_own=True)
                elif self.membership.newer():
                    self._stop_for_generation()
            if self.life.process is None and self.state is not NodeState.SETUP_FAILED:
                self._start_in_generation()
            self.wake.wait(0.5)
            self.wake.clear()

    def _take_over_or_prepare(self) -> tuple[bool, int | None] | None:
        """Adopt the trainer, or prepare the node for one (the main loop starts it in its generation). Returns
        (True, exit status) if it ended while no agent was watching."""
        record = TrainerRecord.load(self.cfg.node_dir)
        if record is not None and (record.job_id, record.attempt) != (self.cfg.job_id, self.cfg.attempt):
            log("WARNING", "trainer record belongs to another job or attempt; ignoring it",
                record_job=record.job_id, record_attempt=record.attempt)
            record = None
        if record is not None and record.alive():
            log("INFO", "adopting the trainer a previous agent started", pid=record.pid, started_at=record.started_at)
            self.membership.adopt(record)
            self.life.adopt(record)
            self.state = NodeState.TRAINING
            self.notice.watch_run_end(lambda: self.state, self._life_done)
            return None
        if record is not None and record.boot_id == boot_id() and record.notice is None:
            code = self.life.ended_unwatched(record)
            log("WARNING", "the trainer ended while no agent was watching; reporting it, starting nothing",
                pid=record.pid, exit_code=code)
            return True, code
        # A trainer that ended unwatched is reported above and the agent exits: nothing to save at the run's end.
        self.notice.watch_run_end(lambda: self.state, self._life_done)
        self.notice.await_first_reads()
        if self.notice.kind is not None:
            return None
        if self._prepare() is None or self.notice.interrupted():
            return None  # failed (setup-failed), or a notice / SIGHUP came first: start nothing
        if self.membership.formed_by_controller:
            since = time.monotonic()
            self.state = NodeState.WAITING  # the main loop starts the trainer when a generation names this node
            self.heartbeater.nudge()
            # The controller forms a generation with this node once it beats `waiting`: tell it now, not at its
            # next sweep (a replacement whose preparation outlasts the controller's own polling would wait for it).
            self._wake_controller("prepared: waiting for a generation", since)
        return None

    def _life_done(self) -> bool:
        """The trainer ended the node's life (the run's end has nothing left to save)."""
        ended, code = self.life.poll()
        return ended and self.membership.ends_life(code)

    def _prepare(self):
        """The node life's preparation (preparation.py). None when it failed (the state is then SETUP_FAILED) or
        was interrupted by a notice or SIGHUP."""
        self.state = NodeState.PREPARING
        self.heartbeater.nudge()
        prepared = self.preparation.run()
        if self.preparation.failure is not None:
            self._setup_failed(self.preparation.failure)
        return prepared

    def _setup_failed(self, failure: PrepareFailed) -> None:
        self.state = NodeState.SETUP_FAILED
        since = time.monotonic()
        log("ERROR", "preparation failed; the trainer is not started", error=str(failure),
            failed_command=failure.command, exit_code=failure.exit_code, output_tail=failure.output_tail)
        self.heartbeater.write_until(self.snapshot, time.monotonic() + SETUP_FAILED_WRITE_S, what="setup-failed")
        self._wake_controller("setup failed", since)

    # --- generations ------------------------------------------------------------------------------------------

    def _start_in_generation(self) -> None:
        """Start the trainer in the generation due (membership.py): a one-node job's, once; a member's newest
        that names this node, with its ranks."""
        generation = self.membership.due()
        if generation is None or self.notice.interrupted():
            return
        prepared = self.preparation.prepared
        if prepared is None:  # an agent that adopted a trainer and saw it end prepares its life again
            prepared = self._prepare()
            if prepared is None or self.notice.interrupted():
                return
        if not self.handovers.wait(self.membership.handovers(generation)):
            return
        env = {**prepared.env, **self.membership.trainer_env(generation)}
        argv, in_container = prepared.launch(self.settings.command, env)  # the job's image: the runtime's `run`
        self.life.start(argv, env, prepared.cwd, container=in_container, **self.membership.joining(generation))
        self.state = NodeState.TRAINING
        if self.membership.entered(generation):
            self.heartbeater.nudge()

    def _stop_for_generation(self) -> None:
        """A newer generation: the running trainer moves into it (next_generation.py)."""
        how, code = next_generation.move(self.life, self.membership, node=self.cfg.node,
                                         budget_s=self.settings.notice_budget_seconds,
                                         noticed=lambda: self.notice.kind is not None)
        if how == next_generation.JOINED:
            self.heartbeater.nudge()
        elif how == next_generation.ENDED:
            self._between_generations(code)

    def _between_generations(self, code: int | None, on_its_own: bool = False) -> None:
        """The trainer of this generation ended (stopped for a newer one, or, `on_its_own`, it exited: an error, or
        a peer was lost and its collectives failed): the node waits for the next generation; the control plane
        decides what the exits mean, woken at once for an error exit (its members wait in their collectives)."""
        self.life.ended(code)
        log("INFO" if code in contract.EXITS_ON_NOTICE else "WARNING", "trainer ended; waiting for the next "
            "generation", exit_code=code, generation=self.membership.running)
        self.life.release()
        self.state = NodeState.WAITING
        since = time.monotonic()
        self.heartbeater.nudge()
        if on_its_own and code not in contract.EXITS_ON_NOTICE:
            self._wake_controller(f"trainer exited {code}", since)

    def _wake_controller(self, why: str, since: float):
        """This node's trainer ended on its own (an error, or done: the job's nodes go now rather than at the next
        sweep), its setup failed, it took its first step (a recovery's end), or it is a member prepared and waiting
        for a generation; not on a notice: once a heartbeat composed after the monotonic time `since` (so saying
        so) has landed, publish the job's sweep nudge in the background (nudge.py). Returns the thread, or None
        when there is no sweep topic or a notice came (the node is going away: not its own failure)."""
        if self.nudger is None or self.notice.kind is not None:
            return None
        return self.nudger.nudge(why, before=lambda: self.heartbeater.wait_landed(since, NUDGE_AFTER_BEAT_S))

    # --- endings -------------------------------------------------------------------------------------------

    def _handle_notice(self) -> int:
        deadline = self.notice.deadline
        trainer = self.life.process
        running = self.life.running()
        log("WARNING", "notice: telling the trainer to save an emergency checkpoint", notice=self.notice.kind,
            trainer_pid=trainer.pid if trainer else None, budget_s=self.settings.notice_budget_seconds)
        self.life.noticed(self.notice.kind)
        self.state = NodeState.PREEMPTING
        self.heartbeater.stop_periodic()
        self.logs.stop()  # no log sends while the trainer saves: the last chunk goes after the final heartbeat
        preempting = threading.Thread(
            target=self.heartbeater.write_until, name="preempting-heartbeat",
            args=(self.snapshot, min(deadline, time.monotonic() + PREEMPTING_WRITE_S)),
            kwargs={"what": "preempting"}, daemon=True,
        )
        preempting.start()
        code = self.life.wait(deadline) if running else self.life.poll()[1]
        deadline = self.notice.save_deadline(deadline)
        self.life.ended(code)
        self.state = NodeState.EXITED
        status = contract.read_status(self.status_path) or {}
        preempting.join(max(0.0, deadline - time.monotonic()))
        written = self.heartbeater.write_until(self.snapshot, deadline + FINAL_WRITE_GRACE_S, what="final")
        self.life.stop_forwarding()
        self.notice.told(NUDGE_SEND_S)  # a quick save must not end the agent before its message is out
        log("WARNING" if written else "ERROR", "notice handled; agent exiting", notice=self.notice.kind,
            exit_code=code, committed_step=status.get("committed_step"), emergency=status.get("emergency"),
            final_heartbeat_written=written, seconds_since_notice=round(time.monotonic() - self.notice.at, 2))
        self.logs.final_flush(contract.LOG_FINAL_FLUSH_S)  # last, and bounded: the save and the report came first
        return 0

    def _report_exit(self, code: int | None) -> int:
        self.life.ended(code, tail_unless=(0,))
        self.state = NodeState.EXITED
        since = time.monotonic()
        self.life.stop_forwarding()
        if code == 0:
            log("INFO", "trainer finished successfully", exit_code=0)
        else:
            log("ERROR", "trainer exited with an error; the controller decides what happens next", exit_code=code,
                output_tail=self.life.output_tail)
        self.heartbeater.stop_periodic()
        written = self.heartbeater.write_until(self.snapshot, time.monotonic() + self.final_report_seconds,
                                               what="final")
        self.logs.final_flush(LOG_EXIT_FLUSH_S)
        if not written:
            # Keep trainer.json: the next agent (systemd restarts a failed one) reports this exit again.
            return 1
        TrainerRecord.clear(self.cfg.node_dir)
        if code not in contract.EXITS_ON_NOTICE:
            nudge = self._wake_controller(f"trainer exited {code}", since)
            if nudge is not None:
                nudge.join(NUDGE_SEND_S)  # the agent exits next: the message must be out first
        return 0

    def _end_after_setup_failure(self) -> int:
        """A notice after a failed preparation (the controller deleting the node, most likely): nothing runs, the
        heartbeat keeps saying setup-failed; written once more, briefly, in case the last beat did not land."""
        self.heartbeater.stop_periodic()
        written = self.heartbeater.write_until(self.snapshot, time.monotonic() + FINAL_WRITE_GRACE_S, what="final")
        failure = self.preparation.failure
        log("WARNING", "notice after a failed preparation; agent exiting", notice=self.notice.kind,
            failed_command=failure.command if failure is not None else None, final_heartbeat_written=written)
        self.logs.final_flush(contract.LOG_FINAL_FLUSH_S)
        return 0

    def _detach(self) -> int:
        log("INFO", "SIGHUP: agent exiting, trainer left running for the next agent to adopt",
            trainer_pid=self.life.process.pid if self.life.process else None)
        self.heartbeater.stop_periodic()
        self.logs.stop(wait=DETACH_LOG_SEND_S)  # logship.json says how far: the next agent goes on from there
        self.life.stop_forwarding()
        return contract.EXIT_AGENT_DETACH


def install_signal_handlers(agent: Agent) -> None:
    signal.signal(signal.SIGTERM, lambda *_: agent.on_notice(NOTICE_SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: agent.on_notice(NOTICE_SIGTERM))
    signal.signal(signal.SIGHUP, lambda *_: agent.on_detach())
