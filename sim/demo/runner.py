"""`respawn demo`: the whole flow on one machine.

On the stand-ins (sim/demo/standins.py: the emulators, the sim, the real functions, the bridges, a Slack receiver),
packs the example workdir (examples/workdir, or the trainer.workdir directory of the user's own job file), uploads it
and registers the scenario's job, as `respawn jobs register` does. Each node boots the real deploy/vm/startup.sh
(sim/node_image.py), whose agent downloads the workdir, runs the setup commands and starts the trainer on the
interpreter the spec names. The runner injects what the scenario says and ends with a summary and the report page.
Everything started is stopped on the way out, also on Ctrl-C (once the record of what ran is written: summary,
report, logs); with keep, not before close().
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from respawn import contract, losswords, schema
from respawn.app import codestore, report
from respawn.control import recovery_time
from sim import emulators
from sim.demo.jobfile import JobFile
from sim.demo.scenario import SIM_MODELS, Preemption, Scenario
from sim.demo.standins import REPO, DemoError, Standins
from sim.demo.summary import HeartbeatSample, Lifetime, RunRecord, from_record, max_live, serving, summarize

# The CLI's emulator project: `respawn jobs …` with FIRESTORE_EMULATOR_HOST set and no --project sees the demo.
PROJECT = codestore.EMULATOR_PROJECT
GPU_MACHINE = "g2-standard-8"  # one L4 built in: the sim keys its capacity by the machine type
TPU_TYPE = "v5litepod-8"
WORKDIR = REPO / "examples" / "workdir"  # the user's code the demo's job runs
# How the Slack alert of each terminal state begins after "Job ID " (functions/alerts.py's titles).
TERMINAL_ALERTS = {schema.State.SUCCEEDED: "succeeded", schema.State.FAILED: "failed",
                   schema.State.INVALID: "has an invalid spec", schema.State.BUDGET_EXHAUSTED: "reached its budget"}


@dataclass
class Progress:
    """What the live view shows; refreshed by the runner's loop."""

    scenario: str
    job_id: str
    t: float = 0.0
    state: str = "PENDING"
    zone: str | None = None
    node: str | None = None
    step: int | None = None
    committed: int | None = None
    total_steps: int | None = None  # the job's, as its trainer reports it (None before it does)
    restarts: int = 0
    live_nodes: int = 0
    workers: list[tuple[int, str, int | None]] = field(default_factory=list)  # the node's hosts: worker, state, step
    members: list[tuple[int, str, str, int | None]] = field(default_factory=list)  # several nodes: slot, node, state, step
    events: list[str] = field(default_factory=list)
    alerts: int = 0


SPEC_MODELS = {sim: spec for spec, sim in SIM_MODELS.items()}  # a node record's provisioningModel → the spec's name


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Short enough that a stocked-out zone list recovers within a demo's minute.
DEMO_PLACEMENT = {"cooldown_seconds": 20, "max_backoff_seconds": 8}


def job_spec(sc: Scenario, checkpoint_dir: Path, workdir: str | None = None,
             job: JobFile | None = None, image: str | None = None) -> dict[str, Any]:
    """The job document's spec: the demo's defaults for the scenario's trainer (examples/workdir's train.py after its
    setup command, on this interpreter, or in `image` on its python3), or the user's job file, with `sc.job` laid
    over them."""
    if job is not None:
        return _merge(stand_in_spec(job, sc, checkpoint_dir, workdir), sc.job)
    t = sc.trainer
    command = ["python", "train.py", "--framework", t.framework, "--steps", str(t.steps), "--state-mb",
               str(t.state_mb), "--checkpoint-every", str(t.checkpoint_every), "--step-seconds", str(t.step_seconds),
               "--seed", str(t.seed), "--log-every", "25"]
    nodes = int(sc.job.get("nodes") or 1)
    env = {"PYTHONUNBUFFERED": "1"}
    if nodes > 1:  # torchrun on every node; the agent gives it the generation's ranks, master and port (PET_*).
        command = ["python", "-m", "respawn.ckpt.launch", "torchrun", "--nproc-per-node", str(t.ranks),
                   *command[1:2], "--ranks", str(nodes * t.ranks), *command[2:]]
        # The generations' ports from a base of the run's own, every one of them free: on loopback the sim's VMs
        # share this machine, where two demos' masters would meet from 29500.
        env["MASTER_PORT"] = str(emulators.free_ports(contract.GENERATION_PORTS))
    elif t.ranks > 1:  # torchrun on the node (rendezvous on loopback, a free port), exit 75 through the wrapper
        command = ["python", "-m", "respawn.ckpt.launch", "torchrun", "--nnodes", "1", "--nproc-per-node",
                   str(t.ranks), "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr",
                   "127.0.0.1", *command[1:2], "--ranks", str(t.ranks), *command[2:]]
    if t.shell:  # a shell without exec as the container's first process (its entrypoint, as many images have)
        command = ["sh", "-c", shlex.join(command)]
    if sc.accelerator == "gpu":
        accelerator = {"kind": "gpu", "machine_type": GPU_MACHINE}
    else:
        accelerator = {"kind": "tpu", "accelerator_type": TPU_TYPE, "runtime_version": "v2-alpha-tpuv5-lite"}
    base = {
        "id": re.sub(r"[^a-z0-9-]+", "-", f"demo-{sc.name}".lower()).strip("-")[: schema.MAX_JOB_ID_LEN],
        "accelerator": accelerator,
        "provisioning": "spot",
        "zones": [z.name for z in sc.zones],
        "trainer": {"command": command, "env": env, "workdir": workdir,
                    "setup": [["python", "prepare.py", "--framework", t.framework]], "interpreter": sys.executable},
        "checkpoint_uri": checkpoint_dir.resolve().as_uri(),
        "max_failures": 10,
        "placement": dict(DEMO_PLACEMENT),
    }
    if image is not None:  # its python3 runs setup and the trainer; the workdir is mounted in
        base["trainer"].update(image=image, interpreter="python3")
    return _merge(base, sc.job)


def stand_in_spec(job: JobFile, sc: Scenario, checkpoint_dir: Path, workdir: str | None) -> dict[str, Any]:
    """The user's job as written, but for what names real Google Cloud or the image: its checkpoints in a folder of
    the demo's (the checkpoint bucket is not reachable), the uploaded workdir's URI, the node image's Python (this
    interpreter), the scenario's zones; the demo's short placement waits where the job sets none."""
    spec = copy.deepcopy(job.spec)
    trainer = spec.setdefault("trainer", {})
    if workdir is not None:
        trainer["workdir"] = workdir
    trainer["interpreter"] = sys.executable
    trainer["env"] = {"PYTHONUNBUFFERED": "1", **(trainer.get("env") or {})}
    spec["checkpoint_uri"] = checkpoint_dir.resolve().as_uri()
    spec["zones"] = [z.name for z in sc.zones]
    spec["placement"] = {**DEMO_PLACEMENT, **(spec.get("placement") or {})}
    return spec


def _document(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as `respawn jobs register` stores it; a deliberately invalid one as written, with its setup commands
    in the stored form all the same (Firestore holds no array inside an array)."""
    try:
        return schema.parse_spec(spec).to_doc()
    except schema.SpecError:
        doc = copy.deepcopy(spec)
        trainer = doc.get("trainer") or {}
        trainer["setup"] = [{"argv": c} if isinstance(c, list) else c for c in trainer.get("setup") or []]
        return doc


def capacity_key(spec: dict[str, Any]) -> str:
    """What the sim counts capacity by: the GPU type, the machine type of a VM with built-in GPUs, the TPU type."""
    acc = spec.get("accelerator") or {}
    if acc.get("kind") == "tpu":
        return acc.get("accelerator_type") or TPU_TYPE
    return acc.get("accelerator_type") or acc.get("machine_type") or GPU_MACHINE


def _cost(status: schema.JobStatus, cap: float | None) -> str:
    """What the job's nodes cost, as the controller's ledger priced them (functions/costs.py): the demo's zones are
    us-central1's, so its g2-standard-8 nodes are priced as they would be there (the sim serves no SKUs: the dated
    offline table, which the figure names)."""
    from respawn import ledger, prices

    c = ledger.summary(status, datetime.now(timezone.utc), cap)
    text = f"{prices.usd(c['so_far_usd'])} (on demand {prices.usd(c['on_demand_usd'])}; {c['prices']})"
    if cap is not None:
        text += f"; budget {prices.usd(cap)}, {c['budget_used']} used"
    return text + (f"; unpriced: {c['unpriced']}" if c.get("unpriced") else "")


def _victims(p: Preemption, status: schema.JobStatus, beats: dict[str, dict[int, dict]],
             known: set[str]) -> list[tuple[str, str]] | None:
    """(zone, node) of each node `p` hits, once they are ready for it; None before. `when: training`: every member
    of the current generation (a one-node job: its node) trains, and the controller has told the job's last
    recovery (a loss before that would fold two recoveries into one figure). `when: joined`: the slot holds a node
    that did not exist at the previous injection (`known`) and whose agent beats."""
    def state(node: str | None) -> str | None:
        return (beats.get(node or "") or {}).get(0, {}).get("state")

    slots = p.targets()
    targets = [status.members[i] for i in slots if i < len(status.members)] if slots else [status]
    if len(targets) != max(len(slots), 1) or any(not (t.node and t.zone) for t in targets):
        return None
    if p.when == "joined":
        return None if targets[0].node in known or state(targets[0].node) is None else [(targets[0].zone, targets[0].node)]
    world = (status.generation or {}).get("members") or [status.node]
    if status.recovering or any(state(n) != "training" for n in world):
        return None
    if any(t.node not in world for t in targets):
        return None
    return [(t.zone, t.node) for t in targets]  # type: ignore[misc]


class DemoRun:
    """A scenario's job on the stand-ins (sim/demo/standins.py): registered, its faults injected when due, watched
    to its end, and its record written (summary.json, the report page, describe.txt, logs.txt)."""

    def __init__(self, sc: Scenario, out_dir: Path, *, on_progress: Callable[[Progress], None],
                 say: Callable[[str], None], job: JobFile | None = None, project: str = PROJECT,
                 firestore_host: str | None = None, pubsub_host: str | None = None):
        self.sc = sc
        self.job = job  # the user's own job file (sim/demo/jobfile.py); None: the demo's example job
        self.project = project  # every document, topic and subscription of the run is this project's
        self.out = out_dir.resolve()  # children run elsewhere: every path handed to them must be absolute
        self.on_progress = on_progress
        self.say = say
        # The trainer's image is the demo example's (a user's own job names its own, which the stand-ins cannot pull).
        self.standins = Standins(sc, self.out, say, project=project, with_image=bool(sc.trainer.image) and job is None,
                                 firestore_host=firestore_host, pubsub_host=pubsub_host)
        self.partitions: list[dict[str, Any]] = []  # the partition fault as injected, and its recovery
        self.noticed: dict[str, float] = {}  # node → when its preemption (or host error) was injected
        self.total_steps: int | None = None  # the job's steps: what its trainer reports (the summary's total_steps)

    @property
    def sim(self):
        return self.standins.sim

    @property
    def slack(self):
        return self.standins.slack

    # --- the run ------------------------------------------------------------------------------------------------

    def run(self, keep: bool = False) -> dict[str, Any]:
        """The job from registration to its end (or to Ctrl-C: `interrupted` in the result), and its summary.
        Everything started is stopped before this returns or raises; with `keep`, after a run that ends, only by
        close()."""
        kept = False
        try:
            result = self._run()
            kept = keep and not result["interrupted"]  # Ctrl-C stops everything, --keep or not
            return result
        finally:
            if not kept:
                try:
                    self.say("stopping everything the demo started")
                finally:  # also when saying so fails (a closed pipe): nothing may outlive the demo
                    self.close()

    def pids(self) -> list[int]:
        return self.standins.pids()

    def close(self) -> None:
        self.standins.close()

    def _run(self) -> dict[str, Any]:
        from google.cloud import firestore
        from google.cloud.firestore_v1.base_query import FieldFilter

        from respawn.app.jobstore import JobStore

        sc = self.sc
        self.standins.start()

        directory = self.job.workdir if self.job is not None else WORKDIR
        spec = job_spec(sc, self.out / "checkpoints", directory and self.standins.upload_workdir(directory), self.job,
                        self.standins.image)
        if self.job is not None:
            self.say(f"{self.job.path.name} on the stand-ins: checkpoint_uri {spec['checkpoint_uri']}, "
                     f"trainer.interpreter {sys.executable}, zones {', '.join(spec['zones'])}")
        job_id = spec["id"]
        key = capacity_key(spec)
        for zone in sc.zones:
            if zone.advice is not None:
                self.sim.set_advice(zone.name, spec["accelerator"]["machine_type"],
                                    obtainability=zone.advice.obtainability,
                                    estimated_uptime=zone.advice.estimated_uptime_seconds)
            for change in zone.capacity:
                if change.at_seconds is not None:
                    self.sim.set_capacity(zone.name, key, change.count, at=self.sim.now() + change.at_seconds,
                                          provisioning_model=change.sim_model)
        db = firestore.Client(project=self.project)
        self.standins.stack.push("Firestore client", db.close)
        nodes_db = firestore.Client(project=self.project, database=schema.NODES_DATABASE)
        self.standins.stack.push("Firestore client (heartbeats)", nodes_db.close)
        self.say(f"registering job {job_id} (a Firestore document, as `respawn jobs register` writes it)")
        sim_t0 = self.sim.now()
        t0 = time.monotonic()
        self._wall_t0 = time.time()  # a heartbeat's own time on the run's clock (_run_ends)
        JobStore(db).register(job_id, _document(spec), source=f"scenario {sc.name}")

        progress = Progress(scenario=sc.name, job_id=job_id)
        samples: list[HeartbeatSample] = []
        seen_events: set[str] = set()
        transitions: list[dict[str, str]] = []
        pending = list(sc.preemptions)
        injected = 0
        known: set[str] = set()  # every node of the job at the last injection (`when: joined` waits for a new one)
        job_ref = db.collection(schema.JOBS).document(job_id)
        status = schema.JobStatus()
        last_poll_events = 0.0
        stopped = None  # why the loop ended before the job did: Ctrl-C (SIGTERM), or the runner's own error
        timed_out = False
        while True:
            try:
                now = time.monotonic() - t0
                if now > sc.timeout_seconds:
                    self.say(f"the job did not finish within the scenario's {sc.timeout_seconds:g} s")
                    timed_out = True
                    break
                snap = job_ref.get()
                status = schema.JobStatus.model_validate((snap.to_dict() or {}).get("status") or {})
                beats: dict[str, dict[int, dict]] = {}  # node → worker → its heartbeat
                for doc in nodes_db.collection(schema.NODES).where(filter=FieldFilter("job_id", "==", job_id)).stream():
                    hb = doc.to_dict() or {}
                    worker = int(hb.get("worker") or 0)
                    # A slice's worker i beats to {node}-w{i} (contract.heartbeat_id): count it under its node.
                    node = doc.id.removesuffix(f"-w{worker}") if worker else doc.id
                    beats.setdefault(node, {})[worker] = hb
                    started = hb.get("started_at")
                    samples.append(HeartbeatSample(
                        t=now, node=node, life=str(started.timestamp() if isinstance(started, datetime) else started),
                        state=str(hb.get("state")), step=hb.get("step"), committed_step=hb.get("committed_step"),
                        resumed_from=hb.get("resumed_from"), worker=worker, generation=hb.get("generation"),
                    ))
                    if isinstance(hb.get("total_steps"), int):  # the trainer's own total, as its status file says
                        self.total_steps = hb["total_steps"]
                self._run_ends(beats, status, now)
                hosts = beats.get(status.node or "") or {}
                current = hosts.get(0) or {}
                live = self.sim.live_nodes(job=job_id)
                if now - last_poll_events > 1.0:
                    last_poll_events = now
                    transitions += self._new_events(job_ref, seen_events, progress)

                if pending and status.node:
                    injected += self._inject_due(pending, known, status, beats, current.get("step") or 0, now,
                                                 key, injected)
                self._partition(status, beats, now)
                progress.t, progress.state, progress.total_steps = now, status.state.value, self.total_steps
                progress.zone, progress.node, progress.restarts = status.zone, status.node, status.restarts
                progress.step, progress.committed = current.get("step"), current.get("committed_step")
                progress.live_nodes, progress.alerts = len(live), len(self.slack.payloads)
                progress.workers = [(w, str(hb.get("state")), hb.get("step")) for w, hb in sorted(hosts.items())]
                # Each slot's row when there are several (one node is the job's own line already).
                progress.members = [(i, m.node or "-", str((beats.get(m.node or "") or {}).get(0, {}).get("state", m.state.value)),
                                     (beats.get(m.node or "") or {}).get(0, {}).get("step"))
                                    for i, m in enumerate(status.members)] if len(status.members) > 1 else []
                self.on_progress(progress)
                if status.state.terminal:
                    break
                time.sleep(0.25)
            except KeyboardInterrupt:  # the record of what ran is still written (summary, report, logs)
                stopped = "interrupted"
                self.say("interrupted: writing the record of what ran, then stopping everything")
                break
            except Exception as exc:  # noqa: BLE001 - the same, then the error is raised
                stopped = f"{type(exc).__name__}: {exc}"
                self.say(f"the run stopped ({stopped}): writing the record of what ran")
                break

        wall = time.monotonic() - t0
        missed = [f"at step {p.at_step}" if p.at_step is not None else f"at {p.at_seconds:g} s" for p in pending]
        if missed and status.state.terminal:
            self.say(f"the job ended before {len(pending)} of the scenario's preemptions ({', '.join(missed)})")
        if self.total_steps is None:
            self.total_steps = status.total_steps
        if self.total_steps is None and self.job is None:  # the demo's example: its command's --steps
            self.total_steps = sc.trainer.steps
        if stopped is None:  # Ctrl-C asks to stop now: no waiting for the last alerts
            self._drain_alerts(job_id, status.state)
        transitions += self._new_events(job_ref, seen_events, progress)
        # The page `respawn jobs report` writes for a real job, from what the control plane recorded (not from the
        # demo's own samples): the same code on the emulator's documents. Its figures (report.figures, computed once
        # from the record) are the summary's too. A page that cannot be written leaves the rest of
        # the record, with the demo's own measures.
        try:
            page, r = report.write(JobStore(db), job_id, self.out / "report.html")
            figures, written = report.figures(r), str(page)
        except Exception as exc:  # noqa: BLE001 - named in the summary
            figures, written = None, f"not written: {type(exc).__name__}: {exc}"
        result = self._finish(job_id, status, samples, sim_t0, wall, transitions, figures)
        result["transitions"] = transitions
        result["message"] = status.message  # the job's last status message: why it ended as it did
        result["partitions"] = self.partitions
        result["preemptions_missed"] = missed if status.state.terminal else []
        result["timed_out"] = timed_out
        result["interrupted"] = stopped == "interrupted"
        result["summary"] = str(self.out / "summary.json")
        result["report"] = written
        described = self._describe(job_id)  # beside the logs' reading: both are CLI processes
        result["logs"] = self._logs(job_id)
        result["describe"] = self._described(described)
        result["nodes_left"] = [h["name"] for h in self.sim.history() if (h.get("labels") or {}).get(
            contract.LABEL_JOB) == job_id and h["live"] and h["live"][-1][1] is None]
        (self.out / "summary.json").write_text(json.dumps(result, indent=2))
        if stopped not in (None, "interrupted"):
            raise DemoError(f"the run stopped: {stopped}")
        return result

    def _inject_due(self, pending: list[Preemption], known: set[str], status: schema.JobStatus,
                    beats: dict[str, dict[int, dict]], step: int, now: float, key: str, injected: int) -> int:
        """The next preemption, once its moment has come and its targets are ready (see Preemption), and the
        capacity changes that follow it; how many were injected (0 or 1)."""
        p = pending[0]
        victims = _victims(p, status, beats, known)
        due = (p.at_step is not None and step >= p.at_step) or (p.at_seconds is not None and now >= p.at_seconds)
        if not victims or not due:
            return 0
        pending.pop(0)
        known.update(m.node for m in status.members if m.node)
        for zone, victim in victims:  # one moment: nothing is awaited in between
            self.say(f"injecting {p.kind} of {victim} in {zone} at step {step}")
            try:
                (self.sim.host_error if p.kind == "host_error" else self.sim.preempt)(zone, victim)
                self.noticed[victim] = now
            except Exception as exc:
                self.say(f"could not inject {p.kind} of {victim}: {exc}")
        for z in self.sc.zones:
            for change in z.capacity:
                if change.after_preemption == injected + 1:
                    self.sim.set_capacity(z.name, key, change.count, at=self.sim.now() + change.delay_seconds,
                                          provisioning_model=change.sim_model)
                    when = f"in {change.delay_seconds:g} s" if change.delay_seconds else "now"
                    self.say(f"capacity of {z.name} {when}: "
                             f"{change.count if change.count is not None else 'unlimited'}")
        return 1

    def _describe(self, job_id: str) -> subprocess.Popen | str:
        """`respawn jobs describe JOB`, started: what it prints goes to describe.txt (the job for a person, as a
        user's shell shows it; every figure the report's), while the logs are read."""
        try:
            with open(self.out / "describe.txt", "w") as f:
                return subprocess.Popen([sys.executable, "-m", "respawn", "jobs", "describe", job_id, "--project",
                                         self.project], stdout=f, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "COLUMNS": "200"})
        except OSError as exc:
            return f"respawn jobs describe could not run: {exc}"

    def _described(self, started: subprocess.Popen | str) -> str:
        """Where describe's table is, or why it is not."""
        if isinstance(started, str):
            return started
        try:
            code = started.wait(timeout=120)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait()
            return "respawn jobs describe did not end within 120 s"
        told = self.out / "describe.txt"
        return str(told) if code == 0 else f"respawn jobs describe failed: see {told}"

    def _logs(self, job_id: str) -> list[str]:
        """Every node's logs, the lost ones' too, as `respawn jobs logs` shows them (docs/watching.md), into logs.txt;
        for the summary, how many lines each node said."""
        try:
            r = subprocess.run([sys.executable, "-m", "respawn", "jobs", "logs", job_id, "--project", self.project],
                               capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"respawn jobs logs could not run: {exc}"]
        (self.out / "logs.txt").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            return [f"respawn jobs logs failed: {r.stderr.strip()[-300:]}"]
        lines = r.stdout.splitlines()
        if all(line.startswith("[") and "] " in line for line in lines):  # several nodes wrote: each line says which
            said = collections.Counter(line[1:line.index("] ")] for line in lines)
        else:
            nodes = {h["name"] for h in self.sim.history() if (h.get("labels") or {}).get(contract.LABEL_JOB) == job_id}
            said = collections.Counter({nodes.pop() if len(nodes) == 1 else "its one node": len(lines)})
        return [f"{node}: {n} lines" for node, n in sorted(said.items())] + [f"in {self.out / 'logs.txt'}"]

    def _run_ends(self, beats: dict[str, dict[int, dict]], status: schema.JobStatus, now: float) -> None:
        """A flex-start node's agent acting on its run's end is that node's notice (not injected: the sim's run ends
        on its own): from the first heartbeat that says so, the node only saves and goes."""
        for node, hosts in beats.items():
            hb = hosts.get(0) or {}
            if hb.get("notice") == contract.NOTICE_RUN_ENDING and node not in self.noticed:
                # When the agent said so, not when this poll saw it: the controller may start the next node between.
                said = hb.get("heartbeat_at")
                self.noticed[node] = min(now, said.timestamp() - self._wall_t0) if isinstance(said, datetime) else now
                self.say(f"{node}'s flex-start run is ending: it saves at step {hb.get('step')} and stops")

    def _partition(self, status: schema.JobStatus, beats: dict[str, dict[int, dict]], now: float) -> None:
        """The scenario's partition fault: cut the slot's member off from its peers once the generation trains at
        the step; heal it when due; record when every rank of a newer generation has stepped past that step (the
        recovery, `recovery_seconds` after the partition)."""
        p = self.sc.faults.partition
        if p is None:
            return

        def hb(node: str | None) -> dict:
            return (beats.get(node or "") or {}).get(0, {})

        g = status.generation or {}
        world = g.get("members") or []
        if not self.partitions:
            target = status.members[p.slot] if p.slot < len(status.members) else None
            if (target is None or target.node not in world or not target.zone
                    or not all(hb(n).get("state") == "training" for n in world)):
                return
            step = max(hb(n).get("step") or 0 for n in world)
            if step < p.at_step:
                return
            self.sim.partition(target.zone, target.node)
            self.say(f"partitioning {target.node} from its peers at step {step}")
            self.partitions.append({"node": target.node, "zone": target.zone, "at": round(now, 1), "step": step,
                                    "generation": g.get("number"), "healed_at": None, "recovery_seconds": None})
            return
        e = self.partitions[0]
        if p.heal_after_seconds is not None and e["healed_at"] is None and now - e["at"] >= p.heal_after_seconds:
            try:
                self.sim.partition(e["zone"], e["node"], heal=True)
                self.say(f"healing the partition of {e['node']}")
            except Exception as exc:  # replaced meanwhile: nothing left to heal
                self.say(f"no partition of {e['node']} to heal: {exc}")
            e["healed_at"] = round(now, 1)
        if e["recovery_seconds"] is None and (g.get("number") or 0) > (e["generation"] or 0) and world and all(
                hb(n).get("state") == "training" and hb(n).get("generation") == g["number"]
                and (hb(n).get("step") or 0) > e["step"] for n in world):
            e["recovery_seconds"] = round(now - e["at"], 1)
            self.say(f"every rank steps past step {e['step']} again, {e['recovery_seconds']} s after the partition")

    def _new_events(self, job_ref, seen: set[str], progress: Progress) -> list[dict]:
        """The job's lifecycle events not seen before, oldest first; each is shown and kept for the summary."""
        fresh = []
        for ev in job_ref.collection(schema.EVENTS).order_by("at").stream():
            if ev.id in seen:
                continue
            seen.add(ev.id)
            e = ev.to_dict()
            details = e.get("details") or {}
            told = recovery_time.line(details) if e.get("cause") == "recovered" else e.get("cause") + (
                f"; {recovery_time.line(details)}" if recovery_time.told(e.get("cause"), details) else "")
            told = "; ".join(filter(None, [told, losswords.event_words(details)]))
            line = f"{e.get('from_state') or '-'} → {e.get('to_state')}: {told}"
            progress.events.append(line)
            self.say(f"event: {line}")
            fresh.append({"from": e.get("from_state"), "to": e.get("to_state"), "cause": e.get("cause"),
                          "details": e.get("details") or {}})
        return fresh

    def _drain_alerts(self, job_id: str, state: schema.State, quiet: float = 2.0, cap: float = 90.0) -> None:
        """Give on_alert (and its Slack retries) time to deliver the last alerts: the one that says how the job ended
        (sent after the status is written and the nodes' deletes are done: a container node's delete took 26 s on
        a loaded machine), then whatever is quiet for `quiet` s."""
        final = f"Job {job_id} {TERMINAL_ALERTS[state]}" if state in TERMINAL_ALERTS else None
        start = time.monotonic()
        deadline, last_count, last_change, told = start + cap, -1, start, False
        while time.monotonic() < deadline:
            if not told and time.monotonic() - start > 5:
                told = True
                self.say("waiting for the last Slack alert (sent once the nodes' deletes are done)")
            count = len(self.slack.payloads)
            if count != last_count:
                last_count, last_change = count, time.monotonic()
            elif time.monotonic() - last_change >= quiet and (
                    final is None or any(p.get("text", "").startswith(final) for p in self.slack.payloads)):
                return
            time.sleep(0.2)

    def _finish(self, job_id, status, samples, sim_t0, wall, transitions,
                figures: dict[str, Any] | None) -> dict[str, Any]:
        history = [h for h in self.sim.history() if (h.get("labels") or {}).get("respawn-job") == job_id]
        lifetimes = []
        for h in history:
            for start, end in h["live"]:
                s, e = start - sim_t0, (None if end is None else end - sim_t0)
                final = h["states"][-1][1] if h["states"] else ""
                lifetimes.append(Lifetime(h["name"], h["zone"], s, e, final,
                                          (h.get("labels") or {}).get(contract.LABEL_SLOT),
                                          SPEC_MODELS.get(h.get("provisioningModel", ""), "")))
        alerts = [p.get("text", "") for p in self.slack.payloads]
        recovered = [e["details"] for e in transitions if recovery_time.told(e["cause"], e["details"])]
        rec = RunRecord(job_id=job_id, total_steps=self.total_steps, wall_seconds=wall, state=status.state.value,
                        restarts=status.restarts, samples=samples, lifetimes=lifetimes, alerts=alerts,
                        noticed=self.noticed, recovered=recovered)
        result = summarize(rec)
        result["cost"] = _cost(status, (self.sc.job.get("budget") or {}).get("max_usd"))
        if figures is not None:  # the record's figures in place of the samples' (one set of numbers, every page)
            result = from_record(result, figures)
        # TPU queued resources (issue #26 item 2): the most requests serving at once (one in its node's notice no
        # longer counts, as for nodes) and those left at the end.
        asked = [Lifetime(h["name"], h["zone"], start - sim_t0, None if end is None else end - sim_t0)
                 for h in self.sim.request_history() if (h.get("labels") or {}).get("respawn-job") == job_id
                 for start, end in h["live"]]
        result.update(max_queued_resources=max_live(serving(asked, self.noticed), wall),
                      queued_resources_left=len(self.sim.queued_resources(job_id)))
        result["expected_state"] = self.sc.expect.state.value
        return result
