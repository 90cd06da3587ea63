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
A trainer that ends on its own — any exit but EXIT_PREEMPTED with no notice: an error, or 0 (done: the nodes go now) —
or a failed setup wakes the controller once its heartbeat has landed (nudge.py: one message to the sweep topic), so that it acts now, not at
its next scheduled sweep; a multi-node member's peers wait for it in their collectives.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Sequence

from respawn import contract
from respawn.contract import Heartbeat, NodeState
from respawn.logs import labels, log, set_labels

from .cloudlog import CloudLog
from .config import AgentConfig
from .envcache import EnvCache
from .firestore_rest import FirestoreError, FirestoreWriter
from .heartbeat import Heartbeater, compose_heartbeat
from .logship import LogShipper
from .reach import MasterProbe, StepClock, own_first_step
from .metadata import TRANSPORT_ERRORS, MetadataClient, TokenError
from .nudge import PUBLISH_TIMEOUT_S, Nudger
from .peers import listen_port, peers_env, serve as serve_peers
from .prepare import AGENT, PrepareFailed, Preparer, write_json
from .prefetch import Prefetch
from .previous_life import upload_previous_life
from .run_end import RunEnd, RunEndTimer
from .storage import Fetcher, Interrupted, Uploader
from .supervisor import LOG_FILE, OutputForwarder, TrainerProcess, TrainerRecord, boot_id
from .watcher import NOTICE_SIGTERM, ValueWatcher, Watcher, maintenance_watch, preempted_watch

# After the notice budget, this long is left to write the final heartbeat (a Spot VM gets 30 s in all).
FINAL_WRITE_GRACE_S = 3.0
PREEMPTING_WRITE_S = 3.0
FIRST_READ_WAIT_S = 10.0
HANDOVER_POLL_S = 0.5  # how often a node created during its predecessor's notice reads that one's heartbeat
# How long a preparation step killed by a signal waits for the agent's own SIGTERM or the notice (they arrive
# together on a power-off) before it counts as a failed setup.
SHUTDOWN_SIGNAL_GRACE_S = 3.0
SETUP_FAILED_WRITE_S = 30.0  # the first setup-failed write; the periodic heartbeat keeps writing it afterwards
PREPARE_FAILED = "prepare.failed.json"  # this boot's failed preparation: reported again, never run again
# A generation of the same members restarts the world because a member's trainer crashed. A trainer blocked in a
# collective with the crashed one cannot run its SIGTERM handler (the signal is only noted until the collective
# returns: at the process group's timeout) and no emergency save is possible without that rank, so the agent kills
# its process group after this grace; the next generation resumes from the newest committed step.
RESTART_STOP_GRACE_S = 5.0
# A trainer handed a generation to rejoin in its process (contract.REJOIN_FILE) first stops at a step boundary with
# an emergency save, as on a notice (notice_budget_seconds); this long more for it to say it has left its world.
REJOIN_ACK_GRACE_S = 5.0
# How long the controller's wake-up (nudge.py) waits for the heartbeat that reports the failure to land first; it is
# sent after this even if none did. An agent about to exit waits this long at most for it to be sent.
NUDGE_AFTER_BEAT_S = 60.0
NUDGE_SEND_S = 2 * PUBLISH_TIMEOUT_S + 1  # the token from the metadata server, then the publish
# The logs' last chunk after the trainer's own end (its report is written first): the node stays until the controller
# deletes it, which it does only after reading that report.
LOG_EXIT_FLUSH_S = 30.0


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _read_json(path: str) -> object:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


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
        self.soft_off_at: float | None = None  # a SIGTERM after a metadata notice (monotonic)
        self._notice_told = False  # the controller was sent this node's notice
        self._notice_nudge: threading.Thread | None = None  # that message's publish
        self.writer = writer
        self.detach = False
        self.state = NodeState.STARTING
        self.started_at = datetime.now(timezone.utc)
        self.exit_code: int | None = None
        self.output_tail: str | None = None
        self.failed_command: list[str] | None = None
        self.trainer: TrainerProcess | None = None
        self.forwarder: OutputForwarder | None = None
        # Each worker of a multi-host slice beats to a document of its own; worker 0's is nodes/{node}, as before.
        self.heartbeater = Heartbeater(writer, contract.heartbeat_id(cfg.node, cfg.worker), self.snapshot,
                                       interval=self.settings.heartbeat_seconds)
        # The node's logs, shipped to the job's checkpoint_uri as they grow (logship.py): they outlive the node.
        # Each chunk also becomes labelled Cloud Logging entries where the job asks for it (cloudlog.py).
        cloud = (CloudLog(cfg.project, cfg.zone or "", md, labels)
                 if self.settings.cloud_logging else None)
        self.logs = LogShipper(Uploader(md), self.settings.checkpoint_uri, self.node_dir, job_id=cfg.job_id,
                               attempt=cfg.attempt, host=contract.heartbeat_id(cfg.node, cfg.worker), cloud=cloud)
        # Wakes the controller when this node fails on its own (a trainer's error exit, a failed setup): without it
        # the controller learns of a failure that loses no VM only at its next scheduled sweep.
        self.nudger = (Nudger(cfg.project, self.settings.sweep_topic, cfg.job_id, md)
                       if self.settings.sweep_topic else None)
        self.watchers = [
            Watcher(md, w, self.on_notice, wait_seconds=self.settings.metadata_wait_seconds)
            for w in (preempted_watch(), maintenance_watch())
        ]
        # A member of a multi-node job trains in one generation at a time (respawn.contract.Generation): it starts
        # its trainer when a generation names it, and restarts it, with the new ranks, for every newer one.
        self.multi_node = cfg.generation is not None
        self.step_clock = StepClock()  # the heartbeat's step_idle_seconds
        self.master_probe = MasterProbe(self.settings.heartbeat_seconds) if self.multi_node else None
        self.generation: contract.Generation | None = None  # the newest one the metadata server gave
        self.trainer_generation: int | None = None  # the one the trainer runs (or last ran)
        self.trainer_members: tuple[str, ...] | None = None  # its members (None: an adopted trainer's are unknown)
        self._prepared: Preparer | None = None
        self.env_cache: EnvCache | None = None  # trainer.cache: the heartbeat's env_cache
        self.generation_watch = (ValueWatcher(md, f"instance/attributes/{contract.ATTR_GENERATION}",
                                              self.on_generation, wait_seconds=self.settings.metadata_wait_seconds)
                                 if self.multi_node else None)

    # --- inputs -------------------------------------------------------------------------------------------

    def on_notice(self, notice: str, detail: str = "") -> None:
        """Called by the watchers, the run-end timer and the signal handler; the first notice wins. A metadata
        notice or the run's end is told to the controller once (whichever came first: a SIGTERM alone may be a
        user's stop); a SIGTERM after one is the soft-off."""
        with self._lock:
            if self.notice is None:
                self.notice, self.notice_at = notice, time.monotonic()
            elif notice == NOTICE_SIGTERM and self.notice != NOTICE_SIGTERM and self.soft_off_at is None:
                self.soft_off_at = time.monotonic()
            tell = notice != NOTICE_SIGTERM and not self._notice_told
            self._notice_told = self._notice_told or tell
        if tell and self.nudger is not None:
            self._notice_nudge = self.nudger.nudge(f"{notice} notice", message=contract.notice_nudge(
                self.cfg.job_id, self.cfg.node, notice, _iso_now()))
        self.wake.set()

    def _watch_run_end(self) -> None:
        """A flex-start node (ATTR_RUN_SECONDS): act on its run's end in time (run_end.py); at once when that time
        has passed already (an agent started late in the run), before anything is started."""
        if self.cfg.run_seconds is None:
            return
        plan = RunEnd.now(self.cfg.run_seconds, self.settings.notice_budget_seconds)
        log("INFO", "flex-start run: its end is known; the trainer saves and stops before it", **plan.describe())
        if plan.act_in <= 0:
            self._on_run_end(plan)
        else:
            RunEndTimer(plan, lambda: self._on_run_end(plan)).start()

    def _on_run_end(self, plan: RunEnd) -> None:
        """The run's end is near: a notice (NOTICE_RUN_ENDING), unless another came first or nothing is left to
        save: a failed preparation (the heartbeat keeps saying so) or a trainer that ended its job (reported, the
        agent exits)."""
        trainer = self.trainer
        if trainer is not None:
            ended, code = trainer.poll()
            done = ended and (not self.multi_node or code == 0)
        else:
            done = False
        if self.notice is not None or done or self.state in (NodeState.SETUP_FAILED, NodeState.EXITED):
            log("INFO", "flex-start run: its end is near; nothing to save", notice=self.notice,
                state=self.state.value, seconds_to_end=round(plan.seconds_to_end(), 1))
            return
        log("WARNING", "flex-start run: its end is near; acting as on a preemption notice",
            notice=contract.NOTICE_RUN_ENDING, seconds_to_end=round(plan.seconds_to_end(), 1),
            budget_s=self.settings.notice_budget_seconds)
        self.on_notice(contract.NOTICE_RUN_ENDING)

    def _save_deadline(self, deadline: float) -> float:
        """`deadline`, or earlier when the soft-off came: then the save has the budget's rest after it."""
        if self.soft_off_at is None:
            return deadline
        return min(deadline, self.soft_off_at + self.settings.notice_budget_seconds - self.settings.notice_seconds)

    def on_generation(self, text: str) -> None:
        """Called by the generation watcher with each new value of ATTR_GENERATION."""
        if not text.strip():
            return  # no generation has formed yet
        try:
            generation = contract.Generation.from_json(text)
        except ValueError as exc:
            log("ERROR", "ignoring a malformed generation; the control plane writes the next one", error=str(exc))
            return
        with self._lock:
            if self.generation is None or generation.number > self.generation.number:
                self.generation = generation
        log("INFO", "generation received", generation=generation.number, members=list(generation.members),
            master_addr=generation.master_addr, member=self.cfg.node in generation.members)
        self.wake.set()

    def on_detach(self) -> None:
        self.detach = True
        self.wake.set()

    def snapshot(self) -> Heartbeat:
        # A failed setup stays the node's outcome when a notice follows (the node being deleted for it): the
        # controller must not read the notice as a preemption and replace the node to fail the same way again.
        failed = self.state is NodeState.SETUP_FAILED
        status = contract.read_status(self.status_path)
        return compose_heartbeat(
            job_id=self.cfg.job_id, attempt=self.cfg.attempt, zone=self.cfg.zone, state=self.state,
            status=status, started_at=self.started_at,
            notice=None if failed else self.notice, exit_code=self.exit_code, output_tail=self.output_tail,
            failed_command=self.failed_command, worker=self.cfg.worker, generation=self.trainer_generation,
            env_cache=self.env_cache.status if self.env_cache is not None else None, **self._reach(status),
        )

    def _reach(self, status: dict | None) -> dict:
        """step_idle_seconds, master_reachable and the trainer's first step (node_agent/reach.py) for this beat."""
        training = self.state is NodeState.TRAINING
        step, committed = (status or {}).get("step"), (status or {}).get("committed_step")
        before = self.step_clock.first_step
        idle = self.step_clock.idle(training, (self.started_at, self.trainer_generation),
                                    step if isinstance(step, int) else None,
                                    committed if isinstance(committed, int) else None,
                                    own_first_step(status, self.started_at))
        if before is None and self.step_clock.first_step is not None:
            # The trainer's first step: a recovery ends here (respawn.control.recovery_time), told now rather
            # than at the next sweep, before the job may end or lose this node again.
            self._wake_controller("the trainer's first step", time.monotonic())
        reachable = None
        if self.master_probe is not None:
            g = self.generation
            # Aimed at the master of the generation this member trains in (none for the master itself).
            master = (g.master_addr if training and g is not None and g.number == self.trainer_generation
                      and g.members[0] != self.cfg.node else None)
            self.master_probe.aim(master)
            reachable = self.master_probe.reachable
        return {"step_idle_seconds": idle, "master_reachable": reachable, "first_step": self.step_clock.first_step,
                "first_step_at": self.step_clock.first_step_at}

    # --- the life ------------------------------------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.local_ckpt_dir, exist_ok=True)
        log("INFO", "node agent starting", node=self.cfg.node, job_id=self.cfg.job_id, attempt=self.cfg.attempt,
            worker=self.cfg.worker, workers=self.cfg.hosts.count, master_addr=self.cfg.hosts.master_addr,
            zone=self.cfg.zone, node_dir=self.node_dir, metadata=self.md.host, pid=os.getpid(),
            python=platform.python_version())
        self.heartbeater.start()
        self.logs.start()
        for w in self.watchers:
            w.start()
        if self.generation_watch is not None:
            self.generation_watch.start()
        if self.master_probe is not None:
            self.master_probe.start()
        # A member's committed steps, for a replacement to restore from (peers.py); the server lives as the agent.
        self.peer_server = serve_peers(self.local_ckpt_dir, self.cfg.address) if self.multi_node else None
        ended_before = self._take_over_or_start()
        if ended_before is not None:
            return self._report_exit(ended_before[1])
        while True:
            if self.notice is not None:
                if self.state is NodeState.SETUP_FAILED:
                    return self._end_after_setup_failure()
                return self._handle_notice()
            if self.detach:
                return self._detach()
            if self.trainer is not None:
                ended, code = self.trainer.poll()
                if ended and (not self.multi_node or code == 0):
                    return self._report_exit(code)
                if ended:
                    self._between_generations(code, on_its_own=True)
                elif self.multi_node and self._newer_generation():
                    self._stop_for_generation()
            if self.multi_node and self.trainer is None and self.state is not NodeState.SETUP_FAILED:
                self._start_in_generation()
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
            self.trainer_generation = record.generation
            self.trainer_members = tuple(record.members) if record.members is not None else None
            # Its earlier output was forwarded by the previous agent already: follow from the current end.
            self._attach(TrainerProcess(self.node_dir, record, child=None),
                         forward_from=_size(os.path.join(self.node_dir, LOG_FILE)))
            self._watch_run_end()
            return None
        if record is not None and record.boot_id == boot_id() and record.notice is None:
            self.trainer = TrainerProcess(self.node_dir, record, child=None)
            code = self.trainer.poll()[1]  # its exit file, read as any exit is (supervisor.finished_anyway)
            log("WARNING", "the trainer ended while no agent was watching; reporting it, starting nothing",
                pid=record.pid, exit_code=code)
            self.started_at = datetime.fromisoformat(record.started_at)
            return True, code
        # A trainer that ended unwatched is reported above and the agent exits: nothing to save at the run's end.
        self._watch_run_end()
        # A node flagged before the agent looked must not start a trainer: wait for the first reads (bounded, in
        # case the metadata server is down; the watchers keep trying in the background).
        deadline = time.monotonic() + FIRST_READ_WAIT_S
        for w in self.watchers:
            w.first_answer.wait(max(0.0, deadline - time.monotonic()))
        if self.notice is not None:
            return None
        prepared = self._prepare()
        if prepared is None or self._interrupted():
            return None  # failed (setup-failed), or a notice / SIGHUP came first: start nothing
        if self.multi_node:
            self._prepared = prepared
            since = time.monotonic()
            self.state = NodeState.WAITING  # the main loop starts the trainer when a generation names this node
            self.heartbeater.nudge()
            # The controller forms a generation with this node once it beats `waiting`: tell it now, not at its
            # next sweep (a replacement whose preparation outlasts the controller's own polling would wait for it).
            self._wake_controller("prepared: waiting for a generation", since)
            return None
        if not self._await_handover():
            return None
        started_at = _iso_now()
        trainer = TrainerProcess.start(self.node_dir, prepared.argv(self.settings.command), prepared.env,
                                       job_id=self.cfg.job_id, attempt=self.cfg.attempt, started_at=started_at,
                                       cwd=prepared.cwd)
        self._attach(trainer)
        return None

    def _await_handover(self, named: Sequence[contract.Handover] = ()) -> bool:
        """Before this node's trainer starts: wait for each node it takes over from (ATTR_HANDOVER, read at boot
        and used once; `named`: the generation's, contract.Generation.handover) until that node's final heartbeat
        says it stopped (its emergency checkpoint is then committed or given up), it never beat, or its notice is
        over, so that two trainers of one place never write checkpoints at once. Preparation ran meanwhile. False
        when a notice or SIGHUP came first."""
        boot, self.cfg = self.cfg.handover, replace(self.cfg, handover=None)
        for handover in [*([boot] if boot is not None else []), *(h for h in named if h.node != self.cfg.node)]:
            if not self._await_one(handover):
                return False
        return True

    def _await_one(self, handover: contract.Handover) -> bool:
        until = datetime.fromisoformat(handover.until)
        doc = contract.heartbeat_id(handover.node, self.cfg.worker)
        log("INFO", "taking over from a node in its notice: waiting for it to stop before training",
            predecessor=handover.node, until=handover.until)
        started, warned = time.monotonic(), False
        while not self._interrupted():
            if datetime.now(timezone.utc) >= until:
                log("INFO", "handover: the predecessor's notice is over; training", predecessor=handover.node,
                    waited_s=round(time.monotonic() - started, 2))
                return True
            try:
                state = self.writer.get_string(contract.NODES_COLLECTION, doc, "state")
            except (FirestoreError, TokenError, *TRANSPORT_ERRORS) as exc:
                if not warned:
                    log("WARNING", "handover: cannot read the predecessor's heartbeat; waiting for its notice to end "
                                   "instead", predecessor=handover.node, error=str(exc) or repr(exc))
                    warned = True
            else:
                if state in (None, NodeState.EXITED.value):
                    log("INFO", "handover: the predecessor stopped; training", predecessor=handover.node,
                        predecessor_state=state, waited_s=round(time.monotonic() - started, 2))
                    return True
            time.sleep(HANDOVER_POLL_S)
        return False

    # --- generations (a multi-node member) -------------------------------------------------------------------

    def _newer_generation(self) -> bool:
        return self.generation is not None and self.generation.number != self.trainer_generation

    def _start_in_generation(self) -> None:
        """Start the trainer with the newest generation's ranks, once per generation that names this node."""
        generation = self.generation
        if generation is None or generation.number == self.trainer_generation or self._interrupted():
            return
        if self.cfg.node not in generation.members:
            return  # not (or no longer) a member: wait for a generation that names this node
        if self._prepared is None:  # an agent that adopted a trainer and saw it end prepares its life again
            self._prepared = self._prepare()
            if self._prepared is None or self._interrupted():
                return
        if not self._await_handover(generation.handover):
            return
        env = {**self._prepared.env, **self._generation_env(generation)}
        set_labels(**contract.log_labels(self.cfg.job_id, self.cfg.attempt, self.cfg.node,
                                         generation.node_rank(self.cfg.node)))  # this member's rank from here on
        self.exit_code = self.output_tail = None
        trainer = TrainerProcess.start(self.node_dir, self._prepared.argv(self.settings.command), env,
                                       job_id=self.cfg.job_id, attempt=self.cfg.attempt, started_at=_iso_now(),
                                       cwd=self._prepared.cwd, generation=generation.number,
                                       members=list(generation.members))
        # Training first, then the new number: a heartbeat in between must never say "waiting in generation N" (a
        # trainer of N that ended), only "training" in the one before, as while the old trainer stopped.
        self._attach(trainer)
        self.trainer_generation, self.trainer_members = generation.number, generation.members
        self.heartbeater.nudge()

    def _generation_env(self, generation: contract.Generation) -> dict[str, str]:
        """What a trainer of this node gets in `generation`: its ranks and master for torchrun (PET_*), for one
        process per node (torch's env://, on the generation's port) and for anyone (RESPAWN_*)."""
        rank, world, master = generation.node_rank(self.cfg.node), generation.world_size, generation.master_addr
        base = self.settings.env.get("MASTER_PORT", "")
        port = contract.generation_port(generation.number, int(base) if base.isdigit() else
                                        contract.TORCHRUN_MASTER_PORT)
        return {contract.ENV_NODE_RANK: str(rank), contract.ENV_NUM_NODES: str(world),
                contract.ENV_MASTER_ADDR: master, contract.ENV_GENERATION: str(generation.number),
                contract.ENV_REJOIN_FILE: os.path.join(self.node_dir, contract.REJOIN_FILE),
                **contract.torchrun_env(rank, world, master), **contract.torch_env(rank, world, master, port),
                **peers_env(generation, self.cfg.node, listen_port())}

    def _stop_for_generation(self) -> None:
        """A newer generation: the trainer stops and the main loop starts it again with the new ranks. New members
        (a node joined or left): a trainer that can rejoin is handed the generation and goes on in its process
        (_hand_over); otherwise SIGTERM, the emergency save as on a notice, bounded by the notice budget, then its
        process group is killed. The same members (a member's trainer crashed): SIGTERM, killed after
        RESTART_STOP_GRACE_S."""
        assert self.trainer is not None and self.generation is not None
        restart = self.generation.members == self.trainer_members
        if not restart and self._hand_over(self.generation):
            return
        log("WARNING", "new generation: stopping the trainer to restart it with the new membership",
            running=self.trainer_generation, newer=self.generation.number, pid=self.trainer.pid,
            same_members=restart)
        self.trainer.signal(signal.SIGTERM)
        if restart:
            code = self._wait_for_trainer(time.monotonic() + RESTART_STOP_GRACE_S, why=(
                f"the trainer did not stop within {RESTART_STOP_GRACE_S:g} s of its generation's restart (a member's "
                "trainer crashed; this one is most likely blocked in a collective with it); killing its process "
                "group: the next generation resumes from the newest committed checkpoint"))
        else:
            code = self._wait_for_trainer(time.monotonic() + self.settings.notice_budget_seconds)
        self._between_generations(code)

    def _hand_over(self, generation: contract.Generation) -> bool:
        """Hand `generation` to a trainer that said it can rejoin (its status file: contract.REJOIN_STATES) in its
        own process: write it into REJOIN_FILE, signal the trainer and wait for it to say it left its world for
        this generation (its status's `generation`). True when it did (the same trainer now runs the new
        generation), when it exited meanwhile (handled as any exit: the main loop starts it again), or when a notice
        came (handled next); False to stop it the old way: it cannot rejoin, or did not answer in time."""
        assert self.trainer is not None
        status = contract.read_status(self.status_path) or {}
        pid = status.get("pid")
        can_leave = status.get("rejoin") in (contract.REJOIN_READY, contract.REJOIN_WAITING)
        if (self.cfg.node not in generation.members or not can_leave
                or status.get("generation") != self.trainer_generation or not self.trainer.owns(pid)):
            return False
        path = os.path.join(self.node_dir, contract.REJOIN_FILE)
        try:
            with open(path + ".tmp", "w") as f:
                f.write(contract.Rejoin(generation.number, self._generation_env(generation)).to_json())
            os.replace(path + ".tmp", path)
            os.kill(pid, getattr(signal, contract.REJOIN_SIGNAL))
        except OSError as exc:
            log("WARNING", "cannot hand the new generation to the trainer; restarting it instead", path=path,
                pid=pid, error=str(exc))
            return False
        log("INFO", "new generation: handing it to the trainer, which rejoins in its process",
            running=self.trainer_generation, newer=generation.number, pid=pid, trainer_state=status.get("rejoin"))
        deadline = time.monotonic() + self.settings.notice_budget_seconds + REJOIN_ACK_GRACE_S
        while time.monotonic() < deadline:
            ended, code = self.trainer.poll()
            if ended:
                self._between_generations(code)
                return True
            if self.notice is not None:
                return True
            status = contract.read_status(self.status_path) or {}
            if status.get("pid") == pid and status.get("generation") == generation.number:
                self.trainer_generation, self.trainer_members = generation.number, generation.members
                self.trainer.record.generation, self.trainer.record.members = generation.number, list(generation.members)
                self.trainer.record.save(self.node_dir)
                self.heartbeater.nudge()
                log("INFO", "the trainer left its world and joins the new generation in its process",
                    generation=generation.number, pid=pid, step=status.get("step"))
                return True
            time.sleep(0.05)
        log("WARNING", "the trainer did not take the new generation in time; stopping it to start it again",
            generation=generation.number, pid=pid,
            waited_s=round(self.settings.notice_budget_seconds + REJOIN_ACK_GRACE_S, 1))
        return False

    def _between_generations(self, code: int | None, on_its_own: bool = False) -> None:
        """The trainer of this generation ended (stopped for a newer one, or, `on_its_own`, it exited: an error, or
        a peer was lost and its collectives failed): the node waits for the next generation; the control plane
        decides what the exits mean, woken at once for an error exit (its members wait in their collectives)."""
        assert self.trainer is not None
        self.exit_code = code
        if code not in (0, contract.EXIT_PREEMPTED):
            self.output_tail = self.trainer.output_tail()
        log("INFO" if code == contract.EXIT_PREEMPTED else "WARNING", "trainer ended; waiting for the next "
            "generation", exit_code=code, generation=self.trainer_generation)
        self._stop_forwarding()
        self.trainer = None
        TrainerRecord.clear(self.node_dir)
        self.state = NodeState.WAITING
        since = time.monotonic()
        self.heartbeater.nudge()
        if on_its_own and code != contract.EXIT_PREEMPTED:
            self._wake_controller(f"trainer exited {code}", since)

    def _wake_controller(self, why: str, since: float):
        """This node's trainer ended on its own (an error, or done: the job's nodes go now rather than at the next
        sweep), its setup failed, it took its first step (a recovery's end), or it is a member prepared and waiting
        for a generation; not on a notice: once a
        heartbeat composed after the monotonic time `since`
        (so saying so) has landed, publish the job's sweep nudge in the background (nudge.py). Returns the thread,
        or None when there is no sweep topic or a notice came (the node is going away: not its own failure)."""
        if self.nudger is None or self.notice is not None:
            return None
        return self.nudger.nudge(why, before=lambda: self.heartbeater.wait_landed(since, NUDGE_AFTER_BEAT_S))

    def _interrupted(self) -> bool:
        return self.notice is not None or self.detach

    def _prepare(self) -> Preparer | None:
        """The node life's preparation (prepare.py). None when it failed (the state is then SETUP_FAILED) or was
        interrupted by a notice or SIGHUP."""
        self.state = NodeState.PREPARING
        self.heartbeater.nudge()
        failed_key = {"job_id": self.cfg.job_id, "attempt": self.cfg.attempt, "boot_id": boot_id(),
                      "settings": self.settings.to_json(), "library": list(self.cfg.library or ())}
        failed_path = os.path.join(self.node_dir, PREPARE_FAILED)
        earlier = _read_json(failed_path)
        if isinstance(earlier, dict) and earlier.get("key") == failed_key:
            log("WARNING", "preparation failed earlier in this boot; reporting it again without running it again",
                failed_command=earlier.get("failed_command"), exit_code=earlier.get("exit_code"))
            self._setup_failed(PrepareFailed(earlier.get("failed_command") or ["?"], earlier.get("message") or "",
                                             exit_code=earlier.get("exit_code"),
                                             output_tail=earlier.get("output_tail")))
            return None
        started = time.monotonic()
        fetcher = Fetcher(self.md)
        if self.settings.cache and self.settings.setup:
            self.env_cache = EnvCache(self.settings.checkpoint_uri, self.node_dir, fetcher, Uploader(self.md),
                                      interrupted=self._interrupted, on_change=self.heartbeater.nudge)
        prep = Preparer(self.settings, self.node_dir, self._trainer_env(), fetcher=fetcher,
                        library=self.cfg.library, interrupted=self._interrupted, cache=self.env_cache)
        try:
            prep.fetch_workdir()
            prep.find_interpreter()
            prep.install_library()
            # The library is in the interpreter's environment now: a previous life's local-only checkpoints go up
            # before anything else runs (setup can take long; a checkpoint only on this disk is at risk).
            upload_previous_life(self.local_ckpt_dir, self.settings.checkpoint_uri,
                                 timeout=self.upload_timeout_seconds, interrupted=self._interrupted,
                                 python=prep.python, env=prep.env)
            if self._interrupted():
                raise Interrupted("previous-life upload")
            prefetch = Prefetch(self.local_ckpt_dir, self.settings.checkpoint_uri, python=prep.python, env=prep.env)
            try:
                if prep.run_setup() and prep.cache_plan is not None and self.env_cache is not None:
                    self.env_cache.upload_in_background(*prep.cache_plan, self.settings.cache)
                prefetch.wait(self.upload_timeout_seconds, self._interrupted)
            finally:
                prefetch.stop()
        except Interrupted as exc:
            log("WARNING", "preparation stopped: the trainer is not started", during=str(exc),
                reason="notice" if self.notice is not None else "SIGHUP")
            return None
        except (PrepareFailed, OSError) as exc:
            # OSError: the node's own trouble (a full disk, …); reported like a failed step rather than crashing the
            # agent, which systemd would restart into the same preparation again and again.
            failure = exc if isinstance(exc, PrepareFailed) else PrepareFailed(
                [AGENT, "prepare"], f"preparing the node failed: {exc}; check the node's disk "
                                              f"(df -h {self.node_dir})")
            if self._killed_by_shutdown(failure):
                log("WARNING", "preparation stopped by the node's shutdown: the trainer is not started",
                    failed_command=failure.command, exit_code=failure.exit_code)
                return None
            try:
                write_json(failed_path, {"key": failed_key, "failed_command": failure.command,
                                         "exit_code": failure.exit_code, "output_tail": failure.output_tail,
                                         "message": str(failure)})
            except OSError as exc2:
                log("WARNING", "cannot record the failed preparation; a restarted agent would prepare again",
                    path=failed_path, error=str(exc2))
            self._setup_failed(failure)
            return None
        try:
            os.unlink(failed_path)
        except FileNotFoundError:
            pass
        log("INFO", "preparation finished", seconds=round(time.monotonic() - started, 3), workdir=prep.workdir,
            interpreter=prep.python)
        return prep

    def _killed_by_shutdown(self, failure: PrepareFailed) -> bool:
        """A step killed by a signal while the node goes down is not a failed setup: the power-off signals every
        process at once, so the step's death can be seen before the agent's own SIGTERM or the notice is."""
        code = failure.exit_code
        if code is None or not (code < 0 or 128 < code <= 128 + 64):  # killed by a signal (-N or the shell's 128+N)
            return False
        deadline = time.monotonic() + SHUTDOWN_SIGNAL_GRACE_S
        while not self._interrupted() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._interrupted()

    def _setup_failed(self, failure: PrepareFailed) -> None:
        self.failed_command, self.exit_code, self.output_tail = failure.command, failure.exit_code, failure.output_tail
        self.state = NodeState.SETUP_FAILED
        since = time.monotonic()
        log("ERROR", "preparation failed; the trainer is not started", error=str(failure),
            failed_command=failure.command, exit_code=failure.exit_code, output_tail=failure.output_tail)
        self.heartbeater.write_until(self.snapshot, time.monotonic() + SETUP_FAILED_WRITE_S, what="setup-failed")
        self._wake_controller("setup failed", since)

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
            contract.ENV_NODE_RANK: str(self.cfg.hosts.worker),
            contract.ENV_NUM_NODES: str(self.cfg.hosts.count),
            contract.ENV_MASTER_ADDR: self.cfg.hosts.master_addr,
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
        self.logs.stop()  # no log sends while the trainer saves: the last chunk goes after the final heartbeat
        preempting = threading.Thread(
            target=self.heartbeater.write_until, name="preempting-heartbeat",
            args=(self.snapshot, min(deadline, time.monotonic() + PREEMPTING_WRITE_S)),
            kwargs={"what": "preempting"}, daemon=True,
        )
        preempting.start()
        code = self._wait_for_trainer(deadline) if running else (trainer.poll()[1] if trainer else None)
        deadline = self._save_deadline(deadline)
        self.exit_code = code
        if code not in (0, contract.EXIT_PREEMPTED) and trainer is not None:
            self.output_tail = trainer.output_tail()
        self.state = NodeState.EXITED
        status = contract.read_status(self.status_path) or {}
        preempting.join(max(0.0, deadline - time.monotonic()))
        written = self.heartbeater.write_until(self.snapshot, deadline + FINAL_WRITE_GRACE_S, what="final")
        self._stop_forwarding()
        if self._notice_nudge is not None:
            self._notice_nudge.join(NUDGE_SEND_S)  # a quick save must not end the agent before its message is out
        log("WARNING" if written else "ERROR", "notice handled; agent exiting", notice=self.notice,
            exit_code=code, committed_step=status.get("committed_step"), emergency=status.get("emergency"),
            final_heartbeat_written=written, seconds_since_notice=round(time.monotonic() - self.notice_at, 2))
        self.logs.final_flush(contract.LOG_FINAL_FLUSH_S)  # last, and bounded: the save and the report came first
        return 0

    def _wait_for_trainer(self, deadline: float, why: str | None = None) -> int | None:
        """The trainer's exit status once it exits, or after `deadline` once its process group is killed (`why`:
        the log line saying so; by default, the notice budget's)."""
        assert self.trainer is not None
        seen = None
        soft_off_seen = False
        while time.monotonic() < self._save_deadline(deadline):
            if self.soft_off_at is not None and not soft_off_seen:
                soft_off_seen = True
                log("WARNING", "soft-off: the VM powers off soon; the emergency save must end by then",
                    seconds_since_notice=round(self.soft_off_at - self.notice_at, 2),
                    seconds_left=round(self._save_deadline(deadline) - time.monotonic(), 2))
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
        if why is None:
            log("ERROR", "the trainer did not exit within the notice budget; killing its process group",
                pid=self.trainer.pid, budget_s=self.settings.notice_budget_seconds)
        else:
            log("WARNING", why, pid=self.trainer.pid)
        self.trainer.kill()
        self.trainer.wait(2.0)
        return self.trainer.poll()[1]

    def _report_exit(self, code: int | None) -> int:
        self.exit_code = code
        if code != 0 and self.trainer is not None:
            self.output_tail = self.trainer.output_tail()
        self.state = NodeState.EXITED
        since = time.monotonic()
        self._stop_forwarding()
        if code == 0:
            log("INFO", "trainer finished successfully", exit_code=0)
        else:
            log("ERROR", "trainer exited with an error; the controller decides what happens next", exit_code=code,
                output_tail=self.output_tail)
        self.heartbeater.stop_periodic()
        written = self.heartbeater.write_until(self.snapshot, time.monotonic() + self.final_report_seconds,
                                               what="final")
        self.logs.final_flush(LOG_EXIT_FLUSH_S)
        if not written:
            # Keep trainer.json: the next agent (systemd restarts a failed one) reports this exit again.
            return 1
        TrainerRecord.clear(self.node_dir)
        if code != contract.EXIT_PREEMPTED:
            nudge = self._wake_controller(f"trainer exited {code}", since)
            if nudge is not None:
                nudge.join(NUDGE_SEND_S)  # the agent exits next: the message must be out first
        return 0

    def _end_after_setup_failure(self) -> int:
        """A notice after a failed preparation (the controller deleting the node, most likely): nothing runs, the
        heartbeat keeps saying setup-failed; written once more, briefly, in case the last beat did not land."""
        self.heartbeater.stop_periodic()
        written = self.heartbeater.write_until(self.snapshot, time.monotonic() + FINAL_WRITE_GRACE_S, what="final")
        log("WARNING", "notice after a failed preparation; agent exiting", notice=self.notice,
            failed_command=self.failed_command, final_heartbeat_written=written)
        self.logs.final_flush(contract.LOG_FINAL_FLUSH_S)
        return 0

    def _detach(self) -> int:
        log("INFO", "SIGHUP: agent exiting, trainer left running for the next agent to adopt",
            trainer_pid=self.trainer.pid if self.trainer else None)
        self.heartbeater.stop_periodic()
        self.logs.stop()  # logship.json says how far: the next agent goes on from there
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
