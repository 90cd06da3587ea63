"""Multi-node recovery: the time from a node's loss to every rank stepping again, Respawn beside the whole-cluster
relaunch (delete every node, create N: SkyPilot's way), in the same run, for jobs of N GPU VMs.
`python -m bench.multinode [--nodes 2,4,8] [--scale 0.2] [--json]`.

Real parts: the Firestore emulator, sim/ reached through the real Compute client, and reconcile (functions/) in
process, called every POLL_S as the events and the sweep would call it. The VMs' agents and trainers are played by
a thread that keeps their contract as the control plane sees it: a VM's agent heartbeats `waiting` PREPARE_S after
the VM runs; a trainer steps RESTART_S after its agent was given a generation that names it (torchrun's start and
the checkpoint's restore). The relaunch baseline drives the same sim through the same ComputeProvider: it deletes
the N VMs and creates N new ones, all in parallel, and its trainers step RESTART_S after the last VM's agent is
prepared (a static torchrun world waits for every rank).

Cloud delays, in seconds (the run is scaled by --scale, the figures are reported unscaled, so the control plane's
own time, real on this machine, is counted 1/scale times: at the default 0.2 an upper bound, five times over):
  CREATE_S   25  instances.insert until the VM runs: ~23-25 s time-to-SSH for VMs of up to 32 vCPUs (R. Aboukhalil,
                 "Move Fast and Break the Cloud", 2018, ~5,000 VMs), 41.5 s for a 2-vCPU VM (C. McAnlis,
                 "Understanding and profiling GCE cold-boot time", 2017)
  PREPARE_S  30  the VM runs until its agent is prepared (assumed: the image's boot and startup script, the agent,
                 the workdir and the setup command; docs/performance.md's bench.boot measures Respawn's part)
  RESTART_S  20  a trainer started until it steps (assumed: torchrun's rendezvous and the checkpoint's restore)
  METADATA_S  2  an instances.setMetadata operation (assumed)
  Deletes take no time in the sim (both sides pay them in parallel).

Figures per N: respawn_s and relaunch_s (loss → every rank of an N-node world stepping), and the VMs created for
the recovery (1 against N: the survivors' VMs, their disks and caches, are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from respawn.contract import ATTR_GENERATION, LABEL_JOB, Generation
from respawn.schema import JOBS, NODES, NODES_DATABASE, parse_node_name, parse_spec
from sim import emulators
from sim.server import SimServer

PROJECT = "respawn-bench"
ZONE = "us-central1-a"
CREATE_S, PREPARE_S, RESTART_S, METADATA_S = 25.0, 30.0, 20.0, 2.0
POLL_S = 0.02  # how often the driver calls reconcile and the agents look (real seconds)


def say(message: str) -> None:
    print(f"bench.multinode: {message}", file=sys.stderr, flush=True)


class Agents(threading.Thread):
    """The VMs' agents and trainers, as the control plane observes them (see the module docstring)."""

    def __init__(self, sim: SimServer, nodes_db, job: str, scale: float, *, relaunch: bool = False) -> None:
        super().__init__(daemon=True, name=f"agents-{job}")
        self.sim, self.nodes_db, self.job, self.scale, self.relaunch = sim, nodes_db, job, scale, relaunch
        self.nodes: dict[str, dict[str, Any]] = {}  # name → running_since, prepared_at, generation, steps_at
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def _beat(self, name: str, state: str, generation: int | None = None) -> None:
        beat(self.nodes_db, name, state, generation)

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            now = time.monotonic()
            live = [i for i in self.sim.instances() if i["labels"].get(LABEL_JOB) == self.job and i["status"] == "RUNNING"]
            for inst in live:
                n = self.nodes.setdefault(inst["name"], {"running_since": now, "prepared_at": None,
                                                         "generation": None, "steps_at": None})
                if n["prepared_at"] is None and now - n["running_since"] >= PREPARE_S * self.scale:
                    n["prepared_at"] = now
                    if not self.relaunch:
                        self._beat(inst["name"], "waiting")
                text = inst["attributes"].get(ATTR_GENERATION) or ""
                if self.relaunch or not text or n["prepared_at"] is None:
                    continue
                g = Generation.from_json(text)
                if inst["name"] in g.members and g.number != n["generation"]:
                    n["generation"], n["steps_at"] = g.number, now + RESTART_S * self.scale
                if n["steps_at"] is not None and now >= n["steps_at"]:
                    n["steps_at"] = None
                    self._beat(inst["name"], "training", n["generation"])

    def stepping(self, members: list[str], generation: int | None) -> bool:
        """Every member's trainer steps in `generation` (relaunch: RESTART_S after the last member is prepared)."""
        if self.relaunch:
            prepared = [self.nodes.get(m, {}).get("prepared_at") for m in members]
            return all(prepared) and time.monotonic() >= max(prepared) + RESTART_S * self.scale  # type: ignore[type-var]
        return all(self.nodes.get(m, {}).get("generation") == generation and self.nodes[m]["steps_at"] is None
                   for m in members)


def beat(nodes_db, name: str, state: str, generation: int | None = None) -> None:
    """A played node's heartbeat, as the agent writes it (the fields the control plane reads)."""
    parsed = parse_node_name(name)
    assert parsed is not None
    nodes_db.collection(NODES).document(name).set({
        "job_id": parsed[0], "attempt": parsed[1], "state": state, "step": 1, "committed_step": 0,
        "generation": generation, "heartbeat_at": datetime.now(timezone.utc)})


def _wait(what: str, predicate, timeout: float, tick: float = POLL_S) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(tick)
    return time.monotonic()


class Driver(threading.Thread):
    """Calls reconcile for the job every POLL_S: what the events and the sweep do, without their delivery delay."""

    def __init__(self, job: str, deps) -> None:
        super().__init__(daemon=True, name=f"driver-{job}")
        self.job, self.deps, self.stop = job, deps, threading.Event()

    def run(self) -> None:
        from respawn.control.reconcile import reconcile

        while not self.stop.wait(POLL_S):
            reconcile(self.job, deps=self.deps)


def respawn_recovery(sim: SimServer, db, nodes_db, deps, nodes: int, scale: float) -> tuple[float, int]:
    """Respawn: a job of `nodes` Spot VMs; its last slot preempted; the seconds until the new generation steps."""
    job = f"rsp-{nodes}"
    spec = parse_spec({"id": job, "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
                       "provisioning": "spot", "zones": [ZONE], "nodes": nodes, "termination_action": "DELETE",
                       "trainer": {"command": ["python", "train.py"]}, "checkpoint_uri": f"gs://bench/{job}"})
    db.collection(JOBS).document(job).set({"spec": spec.to_doc(), "status": {"state": "PENDING"},
                                           "cancel_requested": False})
    agents, driver = Agents(sim, nodes_db, job, scale), Driver(job, deps)
    agents.start()
    driver.start()
    try:
        def status() -> dict:
            return (db.collection(JOBS).document(job).get().to_dict() or {}).get("status") or {}

        def world(number: int) -> bool:
            g = status().get("generation")
            return bool(g) and g["number"] >= number and len(g["members"]) == nodes and agents.stepping(
                g["members"], g["number"])

        _wait(f"{job}: the first generation stepping", lambda: world(1), 600 * scale + 60)
        members = [m["node"] for m in status()["members"]]
        created_before = len(sim.history())
        lost = time.monotonic()
        sim.preempt(ZONE, members[-1])
        done = _wait(f"{job}: the next generation stepping", lambda: world(2), 600 * scale + 60)
        return (done - lost) / scale, len(sim.history()) - created_before
    finally:
        driver.stop.set()
        agents.stop.set()
        driver.join()
        agents.join()


def relaunch_recovery(sim: SimServer, nodes_db, provider, nodes: int, scale: float) -> tuple[float, int]:
    """The baseline: N VMs running; one lost; every VM deleted and N created, in parallel; seconds until stepping."""
    job = f"rel-{nodes}"
    spec = parse_spec({"id": job, "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
                       "provisioning": "spot", "zones": [ZONE], "trainer": {"command": ["python", "train.py"]},
                       "checkpoint_uri": f"gs://bench/{job}"})
    agents = Agents(sim, nodes_db, job, scale, relaunch=True)
    agents.start()
    try:
        with ThreadPoolExecutor(nodes) as pool:
            first = [f"{job}-{i + 1}" for i in range(nodes)]
            list(pool.map(lambda n: provider.create(spec, ZONE, n, int(n.rsplit("-", 1)[1]), "spot", ""), first))
            _wait(f"{job}: the first world stepping", lambda: agents.stepping(first, None), 600 * scale + 60)
            created_before = len(sim.history())
            lost = time.monotonic()
            sim.preempt(ZONE, first[-1])
            list(pool.map(lambda n: provider.delete(ZONE, n), first))
            second = [f"{job}-{nodes + i + 1}" for i in range(nodes)]
            list(pool.map(lambda n: provider.create(spec, ZONE, n, int(n.rsplit("-", 1)[1]), "spot", ""), second))
            done = _wait(f"{job}: the relaunched world stepping", lambda: agents.stepping(second, None),
                         600 * scale + 60)
        return (done - lost) / scale, len(sim.history()) - created_before
    finally:
        agents.stop.set()
        agents.join()


@dataclass
class ControlPlane:
    """What a recovery benchmark runs against: the Firestore emulator, the sim, the real Compute client, reconcile's
    dependencies (control_plane)."""

    sim: SimServer
    db: Any
    nodes_db: Any
    provider: Any
    deps: Any


def control_plane(stack: ExitStack, name: str, scale: float, *, metadata_s: float, op_timeout: float,
                  poll_seconds: float, poll_budget_seconds: float) -> ControlPlane:
    """Start the Firestore emulator and the sim (creates take CREATE_S, setMetadata `metadata_s`, both scaled) and
    build reconcile's dependencies on them; everything is stopped by `stack`."""
    from google.cloud import firestore

    from respawn.control import clients
    from respawn.control.adapters.compute import ComputeProvider
    from respawn.control.adapters.firestore_store import Store
    from respawn.control.observation import Settings
    from respawn.control.reconcile import Config, Deps
    from respawn.control.settings import ControlSettings

    log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"bench-{name}-")))
    say("starting the Firestore emulator and the sim ...")
    fs = emulators.start_firestore(log_dir=log_dir)
    stack.callback(fs.stop)
    sim = SimServer(PROJECT, notice_seconds=0.01, op_delay=CREATE_S * scale / 2,
                    metadata_op_delay=metadata_s * scale).start()
    stack.callback(sim.stop)
    os.environ.update({"FIRESTORE_EMULATOR_HOST": fs.host, "RESPAWN_PROJECT": PROJECT,
                       "RESPAWN_COMPUTE_ENDPOINT": sim.endpoint, "RESPAWN_TPU_ENDPOINT": sim.endpoint})
    provider = ComputeProvider(clients.default(ControlSettings.from_env()), op_timeout=op_timeout)
    db = firestore.Client(project=PROJECT)
    stack.callback(db.close)
    nodes_db = firestore.Client(project=PROJECT, database=NODES_DATABASE)
    stack.callback(nodes_db.close)
    # Heartbeats are written once per change here: no staleness, no boot grace in the way of the figures.
    policy = Settings(stale_heartbeat_seconds=1e6, boot_grace_seconds=1e6)
    deps = Deps(store=Store(db, lambda _database: nodes_db), providers={"gpu": provider}, publish=lambda alert: None,
                project=PROJECT, startup_script=lambda: "#!/bin/bash\n",
                config=Config(policy, poll_seconds=poll_seconds, poll_budget_seconds=poll_budget_seconds))
    return ControlPlane(sim, db, nodes_db, provider, deps)


def run(node_counts: list[int], scale: float) -> dict[str, Any]:
    with ExitStack() as stack:
        cp = control_plane(stack, "multinode", scale, metadata_s=METADATA_S, op_timeout=120, poll_seconds=POLL_S,
                           poll_budget_seconds=0.5)
        sim, db, nodes_db, provider, deps = cp.sim, cp.db, cp.nodes_db, cp.provider, cp.deps
        rows = []
        for n in node_counts:
            say(f"N = {n}: Respawn (replace the lost node) ...")
            respawn_s, respawn_made = respawn_recovery(sim, db, nodes_db, deps, n, scale)
            say(f"N = {n}: relaunch (delete all, create {n}) ...")
            relaunch_s, relaunch_made = relaunch_recovery(sim, nodes_db, provider, n, scale)
            rows.append({"nodes": n, "respawn_s": round(respawn_s, 1), "relaunch_s": round(relaunch_s, 1),
                         "respawn_vms_created": respawn_made, "relaunch_vms_created": relaunch_made})
        return {"scale": scale, "create_s": CREATE_S, "prepare_s": PREPARE_S, "restart_s": RESTART_S,
                "metadata_s": METADATA_S, "rows": rows}


def report(r: dict[str, Any]) -> str:
    lines = [f"loss → every rank stepping (seconds; cloud delays create {r['create_s']:g}, prepare {r['prepare_s']:g},"
             f" restart {r['restart_s']:g}, setMetadata {r['metadata_s']:g}; run at scale {r['scale']:g})",
             f"{'N':>3} {'respawn':>9} {'relaunch':>9} {'VMs made':>12}"]
    for row in r["rows"]:
        lines.append(f"{row['nodes']:>3} {row['respawn_s']:>9.1f} {row['relaunch_s']:>9.1f} "
                     f"{row['respawn_vms_created']:>5} vs {row['relaunch_vms_created']:<4}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.multinode", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="2,4,8", help="comma-separated job sizes (default 2,4,8)")
    p.add_argument("--scale", type=float, default=0.2, help="real seconds per cloud second (default 0.2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.nodes.split(",")]
    except ValueError:
        p.error(f"--nodes: expected comma-separated integers, got {args.nodes!r}")
    if any(not 2 <= n <= 64 for n in counts):
        p.error("--nodes: each job size must be 2..64")
    if not 0 < args.scale <= 1:
        p.error("--scale: must be in (0, 1]")
    with contextlib.redirect_stdout(sys.stderr):  # the control plane's JSON log lines: kept off the figures
        r = run(counts, args.scale)
    print(json.dumps(r) if args.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
