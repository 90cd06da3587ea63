"""Recovery, end to end: from a preemption notice until every rank of the job steps again, for Respawn with each part
of issue #25 on and with all of them, beside the ways others recover, in one run on the same sim with the same cloud
delays. `python -m bench.recovery [--nodes 1,2,4,8] [--scale 0.05] [--state-gb 4] [--env-gb 4] [--quick] [--json]`.

Variants (every job: N GPU Spot VMs in one zone, DELETE-terminated, so each variant replaces the lost node; the
restart in place of a STOP-terminated VM is bench.controller's):
  seeds        the seeds' function: on the audit event, sleep 60 s, start the lost VM again in its zone (its disk and
               environment kept); the other ranks' processes restart with it
  relaunch     SkyPilot's way: a job-status poll sees the loss after the stop; every VM is deleted and N are created;
               each runs setup again and restores from Cloud Storage
  respawn      Respawn as of the issue's start: on the audit event, the lost member is replaced (its slot's node
               deleted and created); setup runs again on the new VM; a single-stream restore from Cloud Storage; the
               survivors restart their processes (import, process group, restore) for the new generation
  +notice      item 1: the agent's notice message; the replacement is created during the notice, trains once the
               noticed node's emergency save ended (the handover); a prepared member's agent wakes the controller
  +cache       item 2: the environment cache replaces setup on the new VM (download + unpack)
  +restore     item 3: parallel ranged reads, at restore_vs_raw_read of the VM's bandwidth (measured in this run)
  +in-process  item 4: survivors keep their processes: a new process group and no restore (N > 1)
  +spares      item 5: one warm spare (spare_nodes 1), booted and prepared before the loss: the next generation
               takes it in the lost member's place (its trainer starts and restores then; with +notice once the
               noticed node's save ended, Generation.handover); the lost slot's replacement is the next spare
  all          items 1-5 together

Real parts: the Firestore emulator, sim/ through the real Compute client (the creates, deletes, starts and
setMetadata of every variant, at the cloud's create time), and the control plane (reconcile in process, woken as
production wakes it: the notice message, the audit event, the scheduled sweep, its own polls). What plays the nodes:
a thread per VM that writes heartbeats as the agent does (`preparing` once booted, `waiting` once prepared on a
member, `exited` when a noticed node's save ended, `training` once stepping) after the stage durations below; the
stages that run Respawn's code on this machine are measured in this run and scaled to the configured sizes: the
restore against a raw read of the same bytes (bench.restore, 1 GiB; 16 MiB from the page cache with --quick: the
restore_vs_raw_read figures, which set the +restore rate) and the unpack of a tar archive by the agent's own code
(node_agent.envcache's unpack rate, which sets +cache's; 512 MB, 32 MB with --quick). The trainers' step time is
left out (every variant pays one step). A preempted VM runs through its notice (the sim's preemption comes WINDOW_S
after the notice), so the notice message finds it still running and a spare or replacement waits for its save (the
handover); until 2026-12-07 the sim powered it off at the notice (its VMs have no guest process to wait for), and the
noticed member was handled as one already gone, with no save to wait for.

How the figures are reported: the cloud's delays and the nodes' stages are played at --scale (real seconds per cloud
second) and scaled back (÷ scale); the control plane's own time on the path (reconcile's passes against the Firestore
emulator and the sim's API, from the event that woke it to the call that ends a stage: the replacement's create, the
generation's setMetadata; the relaunch driver's the same way) is real and reported as measured, not ÷ scale
(Stopwatch). Before 2026-12-07 the whole was divided by the scale, which counted that time 1/scale times over (20
times at 0.05): `all_scaled_seconds` still gives that figure, `control_plane_seconds` the measured part.

Cloud delays and rates (cloud seconds). Google publishes no
figure for several of them (VM create, a Spot VM's start, driver readiness, one connection to Cloud Storage); those
are marked as assumptions:
  WINDOW_S    30  notice → power-off: the soft-off's 30 s (docs/gcp-facts.md §3)
  AUDIT_S     10  the preempted audit entry → sink → Pub/Sub → function: "usually within seconds", 99 % within 60 s of
                  reaching Logging (cloud.google.com/logging/docs/export/pubsub); gcp-facts §17: whether the entry is
                  written at the notice or the stop is unverified, here at the stop
  MESSAGE_S    1  the agent's notice message → Pub/Sub push → function: ~100 ms typical, ~1.2 s at a few messages a
                  minute (googleapis/nodejs-pubsub#925)
  CREATE_S    25  instances.insert until the VM serves: ~23-25 s time-to-SSH for VMs of up to 32 vCPUs (R. Aboukhalil,
                  "Move Fast and Break the Cloud", 2018, ~5,000 VMs; no GPU)
  (instances.start of a TERMINATED VM runs through STAGING as a create does in the sim: ~CREATE_S)
  BOOT_S      30  RUNNING until the agent runs: image boot, GPU driver (preinstalled on Deep Learning VM images; a
                  driver installed at boot adds ~2 min, iterative/cml#1084), startup script, agent (assumption)
  env         --env-gb 4: what setup installs for torch 2.9.0 (cu128): its wheel 0.90 GB and its 16 nvidia-* and
                  triton wheels 3.16 GB (pypi.org/pypi/<name>/json, read 2026-11-25)
  PIP_MBPS   100  setup's download from PyPI (assumption)
  INSTALL_MBPS 120  setup's install (unpack and byte-compile) of the same bytes (assumption)
  GCS_STREAM_MBPS   200  one connection to Cloud Storage (assumption: none published)
  VM_MBPS   2000  a VM's bandwidth to Cloud Storage with many connections: 16 Gbps (G2 VMs reach up to 100 Gbps by
                  machine type, cloud.google.com/compute/docs/gpus/gpu-network-bandwidth; g2-standard-8's own figure
                  is not confirmed)
  SAVE_MBPS  315  the emergency save's write (docs/plan.md: 0.35 GB/s × 0.9)
  PROCESS_S   10  a trainer process until it can restore: `import torch` ~2 s (pytorch/pytorch#143475), NCCL's
                  first communicator ~5 s (NVIDIA/nccl#587), rendezvous (none published)
  REJOIN_S     2  a process group torn down and formed again in the same process (assumption)
  POLL_S      15  SkyPilot's job-status poll (docs/plan.md); its detection: half of it after the stop
  SEED_SLEEP_S 60  the seeds' function sleeps this long first
  SWEEP_S    120  the scheduled sweep (its next tick comes SWEEP_S / 2 after the loss: the expected wait)
  METADATA_S   2  an instances.setMetadata operation: a generation written (assumption)

Figures per variant and N: notice_to_step_seconds, the stages of the slowest member's path (detect: notice → the
create or start call; create; boot; env; wait: handover or generation; start; restore), control_plane_seconds (the
measured part of detect and wait), all_scaled_seconds (the old figure) and the VMs made. Goals: `all` ≤ 0.5 ×
`relaunch` for every N (issue #25); with a warm spare, every rank steps within the 30 s notice, `all` ≤ 0.15 ×
`relaunch` (issue #49 item 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from bench import multinode
from respawn.contract import ATTR_GENERATION, ATTR_HANDOVER, LABEL_JOB, Generation
from respawn.schema import JOBS, parse_spec
from sim.server import SimServer

PROJECT, ZONES = "respawn-bench", ["us-central1-a", "us-central1-b"]
REPO = Path(__file__).resolve().parents[1]
WINDOW_S, AUDIT_S, MESSAGE_S, CREATE_S, BOOT_S = 30.0, 10.0, 1.0, 25.0, 30.0
PIP_MBPS, INSTALL_MBPS, GCS_STREAM_MBPS, VM_MBPS, SAVE_MBPS = 100.0, 120.0, 200.0, 2000.0, 315.0
PROCESS_S, REJOIN_S, POLL_S, SEED_SLEEP_S, SWEEP_S = 10.0, 2.0, 15.0, 60.0, 120.0
METADATA_S = 2.0  # an instances.setMetadata operation (assumption; as bench.multinode's)
QUICK_GB = 0.5  # --quick's state and environment: shorter played stages, the same paths
TICK = 0.01  # how often the played nodes look (real seconds)
PARTS = ("notice", "cache", "restore", "in-process", "spares")
VARIANTS = ("seeds", "relaunch", "respawn", *(f"+{p}" for p in PARTS), "all")


def say(message: str) -> None:
    print(f"bench.recovery: {message}", file=sys.stderr, flush=True)


class Stopwatch:
    """The real time a control plane (Respawn's reconcile, or the bench's relaunch driver) spends on the recovery's
    path, apart from the played delays: each actor (one reconcile invocation, one driver thread) counts from when it
    woke; the played waits inside it (its polls' sleeps, the sim operations' delays of its calls) are left out. The
    calls that end a stage (a create, a generation's commit and its setMetadata) are marked with how much of their
    actor's time until then was its own."""

    def __init__(self, sim: SimServer):
        self.sim = sim
        self.local = threading.local()
        self.lock = threading.Lock()
        self.marks: dict[tuple, tuple[float, float | None, tuple[tuple[float, float], ...]]] = {}

    def begin(self) -> None:
        """The calling thread's actor wakes now (a reconcile invocation starts; the driver leaves its played wait)."""
        self.local.start, self.local.played = self.sim.now(), []

    def playing(self, seconds: float, until: float) -> None:
        """`seconds` of the actor's time until `until` (sim clock) were a played wait."""
        if seconds > 0 and getattr(self.local, "played", None) is not None:
            self.local.played.append((until - seconds, until))

    def mark(self, key: tuple) -> None:
        """A call that ends a stage happens now (the first of its key counts)."""
        start, played = getattr(self.local, "start", None), tuple(getattr(self.local, "played", ()))
        with self.lock:
            self.marks.setdefault(key, (self.sim.now(), start, played))

    def own(self, key: tuple, since: float) -> float | None:
        """The actor's own (measured) seconds from `since` until the call marked `key`; None: no such call, or no
        actor known."""
        got = self.marks.get(key)
        if got is None or got[1] is None:
            return None
        at, start, played = got
        begin = max(start, since)
        waited = sum(max(0.0, min(b, at) - max(a, begin)) for a, b in played)
        return max(0.0, at - begin - waited)

    def at(self, key: tuple) -> float | None:
        got = self.marks.get(key)
        return got[0] if got is not None else None


class TimedProvider:
    """The provider as the control plane calls it, its calls marked on a Stopwatch: a create ends `detect`, a
    generation's setMetadata a member's wait; each call's sim operation (its played delay) is a played wait."""

    def __init__(self, inner: Any, watch: Stopwatch, delays: dict[str, float]):
        self.inner, self.watch, self.delays = inner, watch, delays

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _played(self, kind: str, call: Callable[[], Any]) -> Any:
        t = time.monotonic()
        try:
            return call()
        finally:
            self.watch.playing(min(time.monotonic() - t, self.delays.get(kind, 0.0)), self.watch.sim.now())

    def create(self, spec: Any, zone: str, name: str, *args: Any, **kw: Any) -> Any:
        self.watch.mark(("create", name))
        return self._played("create", lambda: self.inner.create(spec, zone, name, *args, **kw))

    def start(self, zone: str, name: str) -> Any:
        return self._played("start", lambda: self.inner.start(zone, name))

    def delete(self, zone: str, name: str) -> Any:
        return self._played("delete", lambda: self.inner.delete(zone, name))

    def set_attributes(self, zone: str, name: str, values: dict[str, str]) -> Any:
        text = values.get(ATTR_GENERATION)
        if text:
            self.watch.mark(("set", name, Generation.from_json(text).number))
        return self._played("set_attributes", lambda: self.inner.set_attributes(zone, name, values))


class TimedStore:
    """The control plane's store, a commit of a new generation marked on the Stopwatch (the SetGeneration that
    writes it may run on other threads than its reconcile's)."""

    def __init__(self, inner: Any, watch: Stopwatch):
        self.inner, self.watch = inner, watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit(self, job_id: str, version: Any, after: dict, event: Any) -> bool:
        ok = self.inner.commit(job_id, version, after, event)
        number = (after.get("generation") or {}).get("number")
        if ok and number is not None:
            self.watch.mark(("commit", number))
        return ok


@dataclass(frozen=True)
class Model:
    """What a variant's nodes do, in cloud seconds (see the module docstring)."""

    parts: frozenset[str]
    state_mb: float
    env_mb: float
    unpack_mbps: float  # measured: the agent's unpack of a tar
    ratio_gcs: float  # measured: restore ÷ raw read from the storage emulator

    def env_s(self, fresh: bool) -> float:
        if not fresh:  # the same disk: the environment is there
            return 0.0
        if "cache" in self.parts:
            return self.env_mb / VM_MBPS + self.env_mb / self.unpack_mbps
        return self.env_mb / PIP_MBPS + self.env_mb / INSTALL_MBPS

    def restore_s(self) -> float:
        rate = VM_MBPS * self.ratio_gcs if "restore" in self.parts else GCS_STREAM_MBPS
        return self.state_mb / rate

    def survivor_s(self) -> float:
        return REJOIN_S if "in-process" in self.parts else PROCESS_S + self.restore_s()

    def save_s(self) -> float:
        return self.state_mb / SAVE_MBPS


@dataclass
class Node:
    name: str
    first_seen: float  # sim clock: the VM runs
    created_at: float
    fresh: bool = True
    stages: dict[str, float] = field(default_factory=dict)  # stage → sim-clock end
    generation: int | None = None
    steps_at: float | None = None  # when its trainer steps in `generation` (sim clock)


class Nodes(threading.Thread):
    """The VMs of one job, as their agents and trainers would behave (see the module docstring)."""

    def __init__(self, sim: SimServer, nodes_db, job: str, scale: float, model: Model, *, multi: bool,
                 victims_saved: dict[str, float], wake: Callable[[], None] | None = None):
        super().__init__(daemon=True, name=f"nodes-{job}")
        self.wake = wake  # a prepared member's agent wakes the controller (with +notice: the agent as of #25)
        self.sim, self.nodes_db, self.job, self.scale, self.model, self.multi = sim, nodes_db, job, scale, model, multi
        self.saved = victims_saved  # a noticed node → when its emergency save ends (sim clock)
        self.nodes: dict[str, Node] = {}
        self.halt = threading.Event()

    def s(self, cloud_seconds: float) -> float:
        return cloud_seconds * self.scale

    def beat(self, name: str, state: str, generation: int | None = None) -> None:
        multinode.beat(self.nodes_db, name, state, generation)

    def run(self) -> None:
        while not self.halt.wait(TICK):
            now = self.sim.now()
            history = {h["name"]: h for h in self.sim.history()}
            for inst in self.sim.instances():
                if inst["labels"].get(LABEL_JOB) != self.job or inst["status"] != "RUNNING":
                    continue
                n = self.nodes.get(inst["name"])
                if n is None or ("lost" in n.stages and _boots(history, inst["name"]) > _boots_seen(n)):
                    n = self._arrive(inst, history, now, n)
                self._advance(n, inst, now)

    def _arrive(self, inst: dict, history: dict, now: float, old: Node | None) -> Node:
        h = history[inst["name"]]
        restarted = old is not None  # started again in place: same disk
        n = Node(inst["name"], now, h["createdAt"] if not restarted else old.stages["lost"], fresh=not restarted)
        n.stages["boots"] = _boots(history, inst["name"])
        n.stages["running"] = now
        n.stages["booted"] = now + self.s(BOOT_S)
        n.stages["env"] = n.stages["booted"] + self.s(self.model.env_s(n.fresh))
        self.nodes[inst["name"]] = n
        return n

    def _advance(self, n: Node, inst: dict, now: float) -> None:
        st = n.stages
        if "preparing" not in st and now >= st["booted"]:
            st["preparing"] = now
            self.beat(n.name, "preparing")
        if "prepared" not in st and now >= st["env"]:
            handover = inst["attributes"].get(ATTR_HANDOVER)
            if handover and not self._handed_over([json.loads(handover)["node"]], now):
                return
            if handover:
                st["handover_end"] = self.saved[json.loads(handover)["node"]]
            st["prepared"] = now
            if self.multi:
                self.beat(n.name, "waiting")
                if self.wake is not None:
                    self.wake()
            else:
                n.steps_at = now + self.s(PROCESS_S + self.model.restore_s())
        if "prepared" not in st:
            return
        if self.multi:
            text = inst["attributes"].get(ATTR_GENERATION) or ""
            g = Generation.from_json(text) if text else None
            if (g is not None and n.name in g.members and g.number != n.generation
                    and self._handed_over([h.node for h in g.handover], now)):
                survivor = n.generation is not None  # it trained in the previous generation
                if not survivor:
                    st.setdefault("joined", now)
                # Whom it waited for last: the handover (a played save), unless the generation came later.
                ends = [self.saved[h.node] for h in g.handover if h.node in self.saved]
                st["handover_end"] = max([*ends, st.get("handover_end", -1.0)])
                n.generation = g.number
                n.steps_at = now + self.s(self.model.survivor_s() if survivor else PROCESS_S + self.model.restore_s())
                st["generation"] = now
        if n.steps_at is not None and now >= n.steps_at and ("stepping" not in st
                                                             or st["stepping_generation"] != n.generation):
            st["stepping"], st["stepping_generation"] = now, n.generation
            self.beat(n.name, "training", n.generation)

    def _handed_over(self, predecessors: list[str], now: float) -> bool:
        """The nodes this one takes over from during their notice (ATTR_HANDOVER, Generation.handover) ended their
        emergency save: its trainer may start."""
        return all(p in self.saved and now >= self.saved[p] for p in predecessors)

    def stepping(self, members: list[str], generation: int | None, since: float) -> bool:
        got = [self.nodes.get(m) for m in members]
        return all(n is not None and n.stages.get("stepping", -1) >= since and n.stages.get("stepping_generation")
                   == generation for n in got)


def _boots(history: dict, name: str) -> int:
    return int(history.get(name, {}).get("boots") or 0)


def _boots_seen(n: Node) -> int:
    return int(n.stages.get("boots", 0))


def _wait(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    multinode._wait(what, predicate, timeout, TICK)


def _spec(job: str, nodes: int, termination: str = "DELETE", spares: int = 0) -> Any:
    return parse_spec({"id": job, "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
                       "provisioning": "spot", "zones": ZONES if nodes + spares == 1 else ZONES[:1], "nodes": nodes,
                       "spare_nodes": spares, "termination_action": termination,
                       "trainer": {"command": ["python", "train.py"]}, "checkpoint_uri": f"gs://bench/{job}"})


class Run:
    """One variant at one N: the job up, its last member lost, until every rank steps again."""

    def __init__(self, env: "Env", variant: str, nodes: int, model: Model):
        self.env, self.variant, self.n, self.model = env, variant, nodes, model
        self.job = f"{variant.strip('+').replace('-', '')}-{nodes}"
        self.saved: dict[str, float] = {}
        wake = (lambda: self.later(MESSAGE_S, lambda: self.background(self._reconcile))) if (
            "notice" in model.parts and variant not in ("seeds", "relaunch")) else None
        self.spares = 1 if "spares" in model.parts and variant not in ("seeds", "relaunch") else 0
        self.played = Nodes(env.sim, env.nodes_db, self.job, env.scale, model, multi=nodes + self.spares > 1,
                            victims_saved=self.saved, wake=wake)
        self.restarted_at: float | None = None  # seeds: when the lost VM was started again
        # The control plane's own time, measured apart from the played delays (Stopwatch): Respawn's reconcile
        # through these deps, the relaunch's driver through the same provider.
        self.watch = Stopwatch(env.sim)
        s = env.scale
        self.provider = TimedProvider(env.provider, self.watch, {"create": CREATE_S * s, "start": CREATE_S * s / 2,
                                                                 "set_attributes": METADATA_S * s})

        def sleep(seconds: float) -> None:
            time.sleep(seconds)
            self.watch.playing(seconds, env.sim.now())
        self.deps = replace(env.deps, store=TimedStore(env.deps.store, self.watch), providers={"gpu": self.provider},
                            sleep=sleep)
        self.timers: list[threading.Timer] = []
        self.threads: list[threading.Thread] = []

    def s(self, cloud: float) -> float:
        return cloud * self.env.scale

    def later(self, cloud: float, fn: Callable[[], Any]) -> None:
        t = threading.Timer(self.s(cloud), fn)
        t.daemon = True
        t.start()
        self.timers.append(t)

    def background(self, fn: Callable[[], Any]) -> threading.Thread:
        t = threading.Thread(target=fn, daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def measure(self) -> dict[str, Any]:
        self.played.start()
        try:
            return self._respawn() if self.variant not in ("seeds", "relaunch") else self._other()
        finally:
            for t in self.timers:
                t.cancel()
            self.played.halt.set()
            self.played.join()
            for t in self.threads:
                t.join(60)

    # --- Respawn: the real control plane, woken as production wakes it ----------------------------------------

    def _reconcile(self, hint=None) -> None:
        from respawn.control.reconcile import reconcile

        self.watch.begin()
        with contextlib.suppress(Exception):  # a failed invocation is redelivered in production: the next event
            reconcile(self.job, hint, deps=self.deps)

    def _respawn(self) -> dict[str, Any]:
        from respawn.control.observation import NOTICE, Hint

        db, spec = self.env.db, _spec(self.job, self.n, spares=self.spares)
        db.collection(JOBS).document(self.job).set({"spec": spec.to_doc(), "status": {"state": "PENDING"},
                                                    "cancel_requested": False})
        halt = threading.Event()

        def sweeps(first: float) -> None:
            wait = first
            while not halt.wait(self.s(wait)):
                self._reconcile()
                wait = SWEEP_S
        self.background(self._reconcile)  # the job's creation
        self.background(lambda: sweeps(SWEEP_S))
        try:
            members = self._first_world(lambda: self._status())
            halt.set()
            for t in list(self.threads):  # every variant is preempted with no invocation still polling
                t.join()
            # The scheduled sweep's phase is a matter of luck: each variant gets its expected value, half a period
            # after the loss.
            halt.clear()
            self.background(lambda: sweeps(SWEEP_S / 2))
            victim = members[-1]
            t0 = self._lose(victim)
            if "notice" in self.model.parts:
                at = datetime.now(timezone.utc)
                self.later(MESSAGE_S, lambda: self.background(lambda: self._reconcile(Hint(NOTICE, victim, at))))
            self.later(WINDOW_S + AUDIT_S, lambda: self.background(lambda: self._reconcile(Hint("preempted", victim))))
            self._until_stepping(t0, lambda: self._world(self._status()))
            # With a warm spare the ranks may step before the lost slot's replacement (the next spare) is asked for:
            # it is one of the VMs this recovery made all the same.
            _wait(f"{self.job}: the lost slot's replacement created", lambda: bool(self._made(t0)), self.s(2400) + 180)
            return self._figures(t0, victim)
        finally:
            halt.set()

    def _status(self) -> dict:
        return (self.env.db.collection(JOBS).document(self.job).get().to_dict() or {}).get("status") or {}

    def _world(self, status: dict) -> tuple[list[str], int | None]:
        if self.n + self.spares == 1:
            return [m["node"] for m in status.get("members") or [] if m.get("node")][:1], None
        g = status.get("generation") or {}
        return list(g.get("members") or []), g.get("number")

    def _first_world(self, status: Callable[[], dict]) -> list[str]:
        def up() -> bool:
            members, number = self._world(status())
            warm = sum("prepared" in n.stages for n in self.played.nodes.values()) >= self.n + self.spares
            return len(members) == self.n and self.played.stepping(members, number, 0.0) and warm
        _wait(f"{self.job}: the first world stepping", up, self.s(2400) + 180)
        return self._world(status())[0]

    def _lose(self, victim: str) -> float:
        """The notice: the victim saves, and its VM goes at the notice's end (the sim's preemption, WINDOW_S later:
        a VM without a guest process powers off at once; its audit entry is the bench's)."""
        t0 = self.env.sim.now()
        self.saved[victim] = t0 + self.s(self.model.save_s())

        def power_off() -> None:
            with contextlib.suppress(Exception):  # already deleted (the control plane's delete of a leaving node)
                self.env.sim.preempt(ZONES[0], victim)
        self.later(WINDOW_S, power_off)
        return t0

    def _until_stepping(self, t0: float, world: Callable[[], tuple[list[str], int | None]]) -> None:
        def back() -> bool:
            members, number = world()
            return len(members) == self.n and self.played.stepping(members, number, t0) and all(
                self.played.nodes[m].stages.get("stepping", 0) > t0 for m in members)
        _wait(f"{self.job}: every rank stepping again", back, self.s(2400) + 180)

    # --- seeds and relaunch: the bench plays their controller through the same provider -----------------------

    def _other(self) -> dict[str, Any]:
        provider, zone = self.provider, ZONES[0]
        spec = _spec(self.job, self.n, "STOP" if self.variant == "seeds" else "DELETE")
        names = [f"{self.job}-{i + 1}" for i in range(self.n)]
        world = {"members": names, "generation": 1}
        self._give(names, 1)
        with ThreadPoolExecutor(max(self.n, 1)) as pool:
            list(pool.map(lambda n: provider.create(spec, zone, n, int(n.rsplit("-", 1)[1]), "spot", ""), names))
            first = world["generation"] if self.n > 1 else None
            _wait(f"{self.job}: the first world stepping", lambda: self.played.stepping(names, first, 0.0),
                  self.s(2400) + 180)
            victim = names[-1]
            if self.variant == "seeds":
                # The seeds start the VM they lost again in its zone (STOP-terminated: its disk kept).
                t0 = self._lose(victim)
                self.played.nodes[victim].stages["lost"] = t0
                time.sleep(self.s(WINDOW_S + AUDIT_S + SEED_SLEEP_S))
                self.watch.begin()
                _wait(f"{victim} stopped", lambda: self.env.sim.status_of(zone, victim) == "TERMINATED", 60)
                self.restarted_at = self.env.sim.now()
                provider.start(zone, victim)
                new = names
            else:
                t0 = self._lose(victim)
                time.sleep(self.s(WINDOW_S + POLL_S / 2))
                self.watch.begin()  # the driver's own time from here: its deletes and creates, as Respawn's
                list(pool.map(lambda n: provider.delete(zone, n), names))
                for n in names:
                    self.played.nodes.pop(n, None)
                new = [f"{self.job}-{self.n + i + 1}" for i in range(self.n)]
                for n in new:  # the creates run on the pool's threads: marked here, on the driver's
                    self.watch.mark(("create", n))
                list(pool.map(lambda n: provider.create(spec, zone, n, int(n.rsplit("-", 1)[1]), "spot", ""), new))
            world["generation"] = 2
            self._give(new, 2)
            self._until_stepping(t0, lambda: (new, world["generation"] if self.n > 1 else None))
        return self._figures(t0, victim)

    def _give(self, names: list[str], number: int) -> None:
        """A static world (torchrun with fixed ranks) of these VMs: each starts once all are prepared."""
        if self.n == 1:
            return

        def run() -> None:
            def prepared() -> bool:
                nodes = [self.played.nodes.get(name) for name in names]
                return all(n is not None and "prepared" in n.stages for n in nodes)
            _wait("the world's VMs prepared", prepared, self.s(2400) + 180)
            self.watch.begin()
            g = Generation(number, tuple(names), "10.0.0.1").to_json()
            for n in names:
                self.provider.set_attributes(ZONES[0], n, {ATTR_GENERATION: g})
        self.background(run)

    # --- figures ----------------------------------------------------------------------------------------------

    def _figures(self, t0: float, victim: str) -> dict[str, Any]:
        scale = self.env.scale
        nodes = [n for n in self.played.nodes.values() if n.stages.get("stepping", 0) > t0]
        slowest = max(nodes, key=lambda n: n.stages["stepping"])
        done = slowest.stages["stepping"]
        made = self._made(t0)
        st = slowest.stages
        fresh = slowest.first_seen > t0
        stages = {}
        if fresh:
            created = self.restarted_at if self.restarted_at is not None else slowest.created_at
            stages = {"detect": created - t0, "create": st["running"] - created, "boot": st["booted"] - st["running"],
                      "env": st["env"] - st["booted"], "wait": st.get("generation", st["prepared"]) - st["env"]}
            begin = st.get("generation", st["prepared"])
        else:  # a survivor or a spare was last: its new generation came at `generation`
            stages = {"wait": st["generation"] - t0}
            begin = st["generation"]
        last = "spare" if st.get("joined", -1) > t0 else "survivor"
        stages["start_and_restore"] = done - begin
        # The control plane's own time in the stages it ends (measured, real seconds): the create call ends
        # `detect`; the generation's setMetadata, or a handover (a played save) when that ends later, ends `wait`.
        own = {"detect": min(self.watch.own(("create", slowest.name), t0) or 0.0, stages["detect"])} if fresh else {}
        cloud = {k: (v - own.get(k, 0.0)) / scale + own.get(k, 0.0) for k, v in stages.items()}
        cloud["wait"], own["wait"] = self._wait_stage(slowest, st["env"] if fresh else t0, stages["wait"])
        return {"variant": self.variant, "nodes": self.n,
                "notice_to_step_seconds": round(sum(cloud.values()), 1),
                "control_plane_seconds": round(sum(own.values()), 2),
                "all_scaled_seconds": round((done - t0) / scale, 1),  # as before 2026-12-07: everything ÷ scale
                "stages": {k: round(v, 1) for k, v in cloud.items()},
                "vms_created": len(made),
                "last": ("restarted VM" if self.restarted_at is not None else "new VM") if fresh else last}

    def _made(self, t0: float) -> list[dict]:
        """The job's VMs created since `t0`."""
        return [h for h in self.env.sim.history() if h["labels"].get(LABEL_JOB) == self.job and h["createdAt"] > t0]

    def _wait_stage(self, n: Node, since: float, real: float) -> tuple[float, float]:
        """Node n's wait for the generation it steps in, from `since` (real seconds `real`), as reported: (seconds,
        the control plane's measured part of them). Two branches end it, whichever is later once each is scaled
        back: a handover (the played save of the node it takes over from) and the generation's setMetadata (the
        played wake-up, the control plane's measured time, the played operation). Played alone (÷ scale) when no
        generation was written to it, or when the handover ended after the write."""
        scale, st, number = self.env.scale, n.stages, n.stages.get("stepping_generation")
        set_at = self.watch.at(("set", n.name, number)) if number is not None else None
        handover_end = st.get("handover_end", -1.0)
        if set_at is None or handover_end >= set_at:
            return real / scale, 0.0
        own = self.watch.own(("set", n.name, number), since)
        if own is None:  # written on a thread of its reconcile's SetGeneration: its commit's actor, then the call
            commit, commit_at = self.watch.own(("commit", number), since), self.watch.at(("commit", number))
            own = commit + max(0.0, set_at - max(commit_at, since)) if commit is not None and commit_at else 0.0
        to_set = max(0.0, set_at - since)
        own = min(own, to_set)
        written = (to_set - own) / scale + own + max(0.0, real - to_set) / scale  # then the node's next look
        saved = max(0.0, handover_end - since) / scale
        return (written, own) if written >= saved else (saved, 0.0)

@dataclass
class Env:
    sim: SimServer
    db: Any
    nodes_db: Any
    provider: Any
    deps: Any
    scale: float


def measured_rates(quick: bool) -> dict[str, float]:
    """This machine's figures that set +restore's and +cache's rates: bench.restore's restore_vs_raw_read (local,
    storage emulator) and the agent's unpack of a tar (MB/s)."""
    # A full run measures a 1 GiB state: at --quick's 16 MiB (from the page cache: a CI run shares the machine) the
    # step search and client start weigh more than the bytes; --quick checks the mechanism, not the figure.
    size = ["--size-mb", "16", "--repeats", "1", "--warm"] if quick else ["--size-mb", "1024"]
    out = subprocess.run([sys.executable, "-m", "bench.restore", *size, "--json"], cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"bench.restore failed: {out.stderr[-2000:]}")
    restore = json.loads(out.stdout.strip().splitlines()[-1])
    return {"restore_vs_raw_read": restore["restore_vs_raw_read"], "unpack_mbps": unpack_mbps(32 if quick else 512)}


def unpack_mbps(size_mb: int) -> float:
    """The agent's own unpack (node_agent.envcache.unpack_archive) of its own archive of a stand-in environment of
    `size_mb` MB shaped like site-packages: 80 % of the bytes in 16 MB shared libraries, 20 % in 8 KB modules."""
    from respawn.agent import envcache

    with tempfile.TemporaryDirectory(prefix="bench-unpack-") as tmp:
        src, archive, dest = Path(tmp, "venv"), Path(tmp, "env.tar"), Path(tmp, "restored")
        big, small = os.urandom(16 << 20), os.urandom(8 << 10)
        for i in range(int(size_mb * 0.8) // 16):
            (src / "lib").mkdir(parents=True, exist_ok=True)
            (src / "lib" / f"lib{i:03d}.so").write_bytes(big)
        for i in range(int(size_mb * 0.2 * 128)):
            package = src / "site-packages" / f"pkg{i // 100:03d}"
            package.mkdir(parents=True, exist_ok=True)
            (package / f"mod{i % 100:02d}.py").write_bytes(small)
        with open(archive, "wb") as out:
            written = envcache.write_archive([str(src)], out)["bytes"]
        os.sync()
        t = time.perf_counter()
        envcache.unpack_archive(str(archive), [str(dest)])
        os.sync()  # the bytes on the disk, as a node's next step needs them
        return written / (1 << 20) / (time.perf_counter() - t)


def run(node_counts: list[int], scale: float, state_gb: float, env_gb: float, rates: dict[str, float],
        variants: tuple[str, ...]) -> dict[str, Any]:
    base = Model(frozenset(), state_gb * 1024, env_gb * 1024, rates["unpack_mbps"],
                 rates["restore_vs_raw_read"]["gcs"])
    with ExitStack() as stack:
        cp = multinode.control_plane(stack, "recovery", scale, metadata_s=METADATA_S, op_timeout=600,
                                     poll_seconds=5 * scale,
                                     poll_budget_seconds=120 * scale)
        env = Env(cp.sim, cp.db, cp.nodes_db, cp.provider, cp.deps, scale)
        rows = []
        for n in node_counts:
            for variant in variants:
                if variant == "+in-process" and n == 1:
                    continue
                parts = frozenset(PARTS) if variant == "all" else frozenset({variant[1:]} & set(PARTS))
                say(f"N = {n}: {variant} ...")
                rows.append(Run(env, variant, n, replace(base, parts=parts)).measure())
        return {"scale": scale, "state_gb": state_gb, "env_gb": env_gb, **rates,
                "cloud": {"window_s": WINDOW_S, "audit_s": AUDIT_S, "message_s": MESSAGE_S, "create_s": CREATE_S,
                          "boot_s": BOOT_S, "pip_mbps": PIP_MBPS, "install_mbps": INSTALL_MBPS,
                          "gcs_stream_mbps": GCS_STREAM_MBPS, "vm_mbps": VM_MBPS, "save_mbps": SAVE_MBPS,
                          "process_s": PROCESS_S, "rejoin_s": REJOIN_S, "poll_s": POLL_S,
                          "seed_sleep_s": SEED_SLEEP_S, "sweep_s": SWEEP_S, "metadata_s": METADATA_S},
                "rows": rows,
                "notice_to_step_seconds": {f"{r['variant']}@{r['nodes']}": r["notice_to_step_seconds"] for r in rows},
                "all_vs_relaunch": {str(n): _ratio(rows, n) for n in node_counts}}


def _ratio(rows: list[dict], n: int) -> float | None:
    got = {r["variant"]: r["notice_to_step_seconds"] for r in rows if r["nodes"] == n}
    return round(got["all"] / got["relaunch"], 2) if "all" in got and got.get("relaunch") else None


def report(r: dict[str, Any]) -> str:
    lines = [f"notice → every rank stepping again (seconds; state {r['state_gb']:g} GB, environment "
             f"{r['env_gb']:g} GB; run at scale {r['scale']:g}: the played stages scaled back ÷ {r['scale']:g}, the "
             "control plane's own time (cp) as measured on this machine); restore ÷ raw read: "
             f"local {r['restore_vs_raw_read']['local']:.2f}, storage emulator {r['restore_vs_raw_read']['gcs']:.2f}; "
             f"unpack {r['unpack_mbps']:.0f} MB/s",
             f"{'N':>3} {'variant':<12} {'total':>7}  {'detect':>6} {'create':>6} {'boot':>5} {'env':>5} {'wait':>5} "
             f"{'start+restore':>13}  {'cp':>5}  {'all ÷ scale':>11}  {'VMs':>3}  last"]
    for row in r["rows"]:
        s = row["stages"]
        cell = lambda k: f"{s[k]:.1f}" if k in s else "-"  # noqa: E731
        lines.append(f"{row['nodes']:>3} {row['variant']:<12} {row['notice_to_step_seconds']:>7.1f}  "
                     f"{cell('detect'):>6} {cell('create'):>6} {cell('boot'):>5} {cell('env'):>5} {cell('wait'):>5} "
                     f"{cell('start_and_restore'):>13}  {row['control_plane_seconds']:>5.2f}  "
                     f"{row['all_scaled_seconds']:>11.1f}  {row['vms_created']:>3}  {row['last']}")
    lines.append("all ÷ relaunch: " + ", ".join(f"N={n}: {v}" for n, v in r["all_vs_relaunch"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="1,2,4,8", help="comma-separated job sizes (default 1,2,4,8)")
    p.add_argument("--scale", type=float, default=0.05, help="real seconds per cloud second (default 0.05)")
    p.add_argument("--state-gb", type=float, default=4.0, help="the training state (default 4 GB)")
    p.add_argument("--env-gb", type=float, default=4.0,
                   help="what setup installs: torch's CUDA wheel with its nvidia-* wheels (default 4 GB)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--quick", action="store_true",
                   help="CI size: N = 2 (one member lost of two: the variants' VM counts differ), scale 0.01, "
                        "state and environment 0.5 GB each, the rates measured at small sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in ("2" if args.quick else args.nodes).split(",")]
    except ValueError:
        p.error(f"--nodes: expected comma-separated integers, got {args.nodes!r}")
    if any(not 1 <= n <= 32 for n in counts):
        p.error("--nodes: each job size must be 1..32")
    variants = tuple(v for v in args.variants.split(",") if v)
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    scale = 0.01 if args.quick else args.scale
    if not 0 < scale <= 1:
        p.error("--scale: must be in (0, 1]")
    say("measuring this machine's restore and unpack rates ...")
    rates = measured_rates(args.quick)
    with contextlib.redirect_stdout(sys.stderr):  # the control plane's JSON log lines: kept off the figures
        sizes = (QUICK_GB, QUICK_GB) if args.quick else (args.state_gb, args.env_gb)
        r = run(counts, scale, *sizes, rates, variants)
    print(json.dumps(r) if args.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
