"""Sweep benchmark: the fanned-out sweep beside the serial one it replaced, over many registered jobs while one job's
operation hangs. `python -m bench.sweep [--jobs 2000] [--quick] [--json]`.

The storm benchmark's setting (bench/controller.py's Cloud): the Firestore and Pub/Sub emulators, sim/ with
instant cloud latencies, the functions served in-process by the Functions Framework and reached through the real
Compute client. --jobs jobs are registered: a share running (a node RUNNING, a fresh heartbeat), a share whose Spot
VM was preempted with the event lost (the sweep must restart it), the rest waiting for capacity (their zones are
stocked out). One more job, "a-slow", listed first, was preempted in a zone whose operations hang: its restart in
place stays pending for --slow-seconds (a TPU create may take minutes; the adapters wait up to 480 s).

Fanned out: Cloud Scheduler's tick goes to on_sweep, which publishes one message per active job to the sweep topic;
the topic's push subscription (sim.bridges.PushRelay) delivers each to on_sweep, --concurrency at once (the
deployed 10 instances x concurrency 8).
Serial: what on_sweep did before, kept here only as the baseline: one invocation reconciles every active job in turn.
Between the two passes the same nodes are preempted again and the slow zone held again.

  tick_seconds            the tick's invocation: list the jobs, publish, scan for orphans
  publish_seconds         of which publishing the messages (on_sweep's own log line)
  others_seconds          tick to the moment every job but a-slow has been reconciled once
  all_seconds             tick to the moment every job, a-slow included, has been reconciled once
  before_slow_ended       jobs (of --jobs) reconciled while a-slow's operation was still pending
Each pass also checks what the sweep did: the preempted jobs run again in place, the others are as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any, Callable

from bench.controller import (Cloud, LogCapture, STORM_ZONES, T4, captured_stdout, machine, parallel, percentile, say,
                              spec_doc)
from respawn.control import clients
from respawn.control.adapters.compute import ComputeProvider
from respawn.control.settings import ControlSettings
from respawn.contract import heartbeat_id
from respawn.schema import JOBS, NODES, JobStatus, MemberStatus, State, node_name, parse_spec
from sim.bridges import pubsub_cloudevent

SLOW_ZONE = "us-west1-a"  # a-slow's only zone: its operations hang there
WAITING_ZONES = ["europe-west4-a", "europe-west4-b"]  # stocked out
SLOW = "a-slow"  # listed before every job-NNNN: the serial sweep meets it first
QUICK_SERIAL_HANG_S = 2.0  # --quick's serial pass: the others wait behind a-slow whatever the hang's length


def _mix(jobs: int) -> dict[str, list[str]]:
    """60 % running, 30 % preempted with the event lost, 10 % waiting for capacity (at least one of each)."""
    ids = [f"job-{i:04d}" for i in range(jobs)]
    preempted = max(1, jobs * 3 // 10)
    waiting = max(1, jobs // 10)
    return {"preempted": ids[:preempted], "waiting": ids[preempted:preempted + waiting],
            "running": ids[preempted + waiting:]}


def _running_status(zone: str, node: str) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    member = MemberStatus(state=State.RUNNING, attempt=1, node=node, zone=zone, provisioning="spot",
                          create_state="created", node_started_at=now)
    return JobStatus(state=State.RUNNING, attempt=1, node=node, zone=zone, provisioning="spot", members=[member],
                     zones_used=[zone], updated_at=now, revision=1).model_dump()


def setup(cloud: Cloud, mix: dict[str, list[str]], concurrency: int) -> dict[str, str]:
    """Write every job as its state says, with its node in the sim; the waiting ones are placed by on_job_created
    into their stocked-out zones. Returns job → the zone of its node (running and preempted jobs)."""
    from google.cloud import firestore

    sim, db = cloud.sim, cloud.db
    for zone in WAITING_ZONES:
        sim.set_capacity(zone, T4, 0)
    placed = {job: STORM_ZONES[i % len(STORM_ZONES)] for i, job in enumerate(mix["running"] + mix["preempted"])}
    placed[SLOW] = SLOW_ZONE
    say(f"setup: {len(placed)} nodes in the sim ...")
    settings = ControlSettings.from_env()
    provider = ComputeProvider(clients.default(settings), op_timeout=settings.compute_op_timeout_seconds,
                               nodes=settings.nodes)
    parallel(min(concurrency, 16), list(placed), lambda j: provider.create(
        parse_spec(spec_doc(j, [placed[j]])), placed[j], node_name(j, 1), 1, "spot", ""), "creating nodes")
    say(f"setup: {len(placed) + len(mix['waiting'])} job documents and {len(placed)} heartbeats ...")
    docs = [(j, spec_doc(j, [placed[j]]), _running_status(placed[j], node_name(j, 1))) for j in placed]
    docs += [(j, spec_doc(j, WAITING_ZONES), JobStatus(updated_at=datetime.now(timezone.utc)).model_dump())
             for j in mix["waiting"]]
    for start in range(0, len(docs), 250):
        batch, beats = db.batch(), cloud.nodes_db.batch()  # a batch writes within one database
        for job, spec, status in docs[start:start + 250]:
            batch.set(db.collection(JOBS).document(job), {"spec": parse_spec(spec).to_doc(), "status": status,
                                                         "cancel_requested": False, "created_at": firestore.SERVER_TIMESTAMP})
            if job in placed:
                node = node_name(job, 1)
                beats.set(cloud.nodes_db.collection(NODES).document(heartbeat_id(node)), {
                    "job_id": job, "attempt": 1, "worker": 0, "state": "training", "step": 100, "committed_step": 90,
                    "heartbeat_at": datetime.now(timezone.utc)})
        batch.commit()
        beats.commit()
    capture = LogCapture()
    with captured_stdout(capture):
        codes = parallel(min(concurrency, 16), mix["waiting"], cloud.job_created, "placing the waiting jobs")
    waiting = [j for j in mix["waiting"] if cloud.status(j).get("state") == State.WAITING_FOR_CAPACITY.value]
    if any(c != 200 for c in codes) or len(waiting) != len(mix["waiting"]):
        raise RuntimeError(f"setup: {len(mix['waiting']) - len(waiting)} of {len(mix['waiting'])} jobs in stocked-out "
                           "zones are not WAITING_FOR_CAPACITY; see the emulator logs")
    return placed


def preempt(cloud: Cloud, placed: dict[str, str], jobs: list[str]) -> None:
    """Preempt each job's node (the audit events are dropped: only the sweep can see it) and wait until each is
    TERMINATED."""
    sim = cloud.sim
    for job in jobs:
        sim.preempt(placed[job], node_name(job, 1))
    sim.wait_for(lambda: all(sim.status_of(placed[j], node_name(j, 1)) == "TERMINATED" for j in jobs), timeout=120,
                 what=f"{len(jobs)} preempted nodes TERMINATED")
    while not cloud.entries.empty():
        cloud.entries.get_nowait()


class Pass:
    """One sweep's record: when each job's reconcile ended, and when a-slow's operation was let go."""

    def __init__(self, label: str, total: int, slow_seconds: float, release: Callable[[], None],
                 until_others: bool = False):
        """a-slow's operation is let go after `slow_seconds`; with `until_others`, as soon as every other job has
        been reconciled if that comes first (--quick: the hang need not outlast what the test asserts)."""
        self.label, self.total, self.until_others = label, total, until_others
        self.t0 = time.monotonic()
        self.done: dict[str, float] = {}
        self.slow_ended: float | None = None
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._release, self._released = release, threading.Lock()
        self._timer = threading.Timer(slow_seconds, self._let_go)
        self._timer.start()
        self._monitor = threading.Thread(target=self._progress, daemon=True)
        self._monitor.start()

    def _let_go(self) -> None:
        with self._released:
            if self.slow_ended is None:
                self._release()
                self.slow_ended = time.monotonic() - self.t0

    def reconciled(self, job: str) -> None:
        with self.lock:
            self.done.setdefault(job, time.monotonic() - self.t0)
            others_done = self.until_others and sum(1 for j in self.done if j != SLOW) == self.total - 1
        if others_done:
            self._timer.cancel()
            self._let_go()

    def _progress(self) -> None:
        while not self._stop.wait(2.0):
            pending = "pending" if self.slow_ended is None else "done"
            say(f"  {self.label}: {len(self.done)}/{self.total} reconciled, {time.monotonic() - self.t0:.1f} s "
                f"(a-slow's operation {pending})")

    def finish(self) -> dict[str, Any]:
        self._timer.join()
        self._stop.set()
        self._monitor.join()
        others = [t for j, t in self.done.items() if j != SLOW]
        ended = self.slow_ended or 0.0
        return {"others_seconds": round(max(others), 2), "all_seconds": round(max(self.done.values()), 2),
                "before_slow_ended": sum(1 for t in others if t < ended), "reconciled": len(self.done),
                "p50_seconds": round(percentile(others, 50), 2), "slow_ended_seconds": round(ended, 2)}


def fanned_out(cloud: Cloud, total: int, slow_seconds: float, until_others: bool = False) -> dict[str, Any]:
    sim = cloud.sim
    sim.hold_operations(SLOW_ZONE)
    capture = LogCapture()
    with captured_stdout(capture):
        run = Pass("fanned out", total, slow_seconds, lambda: sim.release_operations(SLOW_ZONE), until_others)
        cloud.sweep_relay.on_done = lambda message, status: run.reconciled(message["job_id"])
        tick = cloud.post("on_sweep", *pubsub_cloudevent(b'{"task": "sweep"}'))
        tick_seconds = time.monotonic() - run.t0
        statuses = [status for _, status in cloud.sweep_relay.drain()]
        result = run.finish()
    cloud.sweep_relay.on_done = None
    sent = [line for line in capture.take() if "active job(s) sent to" in line.get("message", "")]
    if tick != 200 or any(s != 200 for s in statuses) or len(sent) != 1:
        raise RuntimeError(f"fanned out: tick HTTP {tick}, {sum(s != 200 for s in statuses)} deliveries not 200, "
                           f"{len(sent)} publish log lines")
    return {**result, "tick_seconds": round(tick_seconds, 2), "publish_seconds": sent[0]["publish_seconds"],
            "published": sent[0]["published"], "deliveries": len(statuses)}


def serial(cloud: Cloud, total: int, slow_seconds: float, until_others: bool = False) -> dict[str, Any]:
    """The baseline: every active job reconciled in turn in one invocation (on_sweep before the fan-out)."""
    from respawn.control.reconcile import Deps, reconcile

    sim = cloud.sim
    sim.hold_operations(SLOW_ZONE)
    capture = LogCapture()
    with captured_stdout(capture):
        run = Pass("serial", total, slow_seconds, lambda: sim.release_operations(SLOW_ZONE))
        deps = Deps.default()
        for job in deps.store.active_jobs():
            reconcile(job, deps=deps)
            run.reconciled(job)
        result = run.finish()
    return result


def check(cloud: Cloud, placed: dict[str, str], mix: dict[str, list[str]], label: str) -> dict[str, int]:
    """What the sweep must have done: every preempted job (a-slow too) RUNNING again on its node, restarted in
    place; every running job as it was; every waiting job still waiting."""
    wrong = []
    for job in mix["preempted"] + [SLOW] + mix["running"]:
        st = cloud.status(job)
        node_status = cloud.sim.status_of(placed[job], node_name(job, 1))
        if st.get("state") != State.RUNNING.value or st.get("node") != node_name(job, 1) or node_status != "RUNNING":
            wrong.append(f"{job}: {st.get('state')} node {st.get('node')} ({node_status})")
    for job in mix["waiting"]:
        if cloud.status(job).get("state") != State.WAITING_FOR_CAPACITY.value:
            wrong.append(f"{job}: {cloud.status(job).get('state')}, expected WAITING_FOR_CAPACITY")
    if wrong:
        raise RuntimeError(f"{label}: {len(wrong)} jobs not as the sweep should leave them: {wrong[:3]}")
    return {"running": len(mix["running"]) + len(mix["preempted"]) + 1, "waiting": len(mix["waiting"])}


def run(args: argparse.Namespace) -> dict[str, Any]:
    mix = _mix(args.jobs)
    total = args.jobs + 1
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="respawn-bench-") as tmp:
        cloud = Cloud(stack, tmp, metadata_servers=False)  # thousands of nodes: no guest, no server thread each
        # Heartbeats stay fresh for the whole run, and a node may be restarted in place again in the second pass.
        os.environ.update({"RESPAWN_STALE_HEARTBEAT_SECONDS": "86400", "RESPAWN_MAX_IN_PLACE_RESTARTS": "1000"})
        cloud.sweep_relay.concurrency = args.concurrency
        placed = setup(cloud, mix, args.concurrency)
        result: dict[str, Any] = {"jobs": total, "mix": {k: len(v) for k, v in mix.items()}}
        result["mix"]["preempted"] += 1  # a-slow
        for label, sweep in (("fanned_out", fanned_out), ("serial", serial)):
            preempt(cloud, placed, mix["preempted"] + [SLOW])
            # --quick: the fanned-out hang ends once every other job is reconciled (at most --slow-seconds), the
            # serial one after QUICK_SERIAL_HANG_S (in turn, every other job waits behind it however long it is).
            slow = QUICK_SERIAL_HANG_S if args.quick and label == "serial" else args.slow_seconds
            say(f"{label.replace('_', ' ')} sweep of {total} jobs; a-slow's restart hangs for {slow:g} s"
                + (" or until every other job is reconciled" if args.quick and label == "fanned_out" else ""))
            result[label] = sweep(cloud, total, slow, args.quick)
            result[label]["outcome"] = check(cloud, placed, mix, label)
            say(f"  {label.replace('_', ' ')}: every job but a-slow reconciled after "
                f"{result[label]['others_seconds']:.1f} s, all after {result[label]['all_seconds']:.1f} s")
    result["config"] = {"jobs": args.jobs, "slow_seconds": args.slow_seconds, "concurrency": args.concurrency}
    return result


def report(r: dict[str, Any]) -> str:
    f, s = r["fanned_out"], r["serial"]
    n = r["jobs"] - 1
    rows = [
        ("tick: list, publish, orphan scan", f"{f['tick_seconds']:.1f} s", "-"),
        ("  of which publishing the messages", f"{f['publish_seconds']:.2f} s ({f['published']} messages)", "-"),
        ("every job but a-slow reconciled", f"{f['others_seconds']:.1f} s", f"{s['others_seconds']:.1f} s"),
        ("every job reconciled", f"{f['all_seconds']:.1f} s", f"{s['all_seconds']:.1f} s"),
        ("half the jobs reconciled (p50)", f"{f['p50_seconds']:.1f} s", f"{s['p50_seconds']:.1f} s"),
        ("reconciled while a-slow's operation hung", f"{f['before_slow_ended']}/{n}", f"{s['before_slow_ended']}/{n}"),
    ]
    w0 = max(len(x[0]) for x in rows)
    w1 = max(len(x[1]) for x in rows + [("", "fanned out")])
    out = [f"{'':<{w0}}  {'fanned out':>{w1}}  serial (before)"]
    out += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    m = r["mix"]
    out += ["", f"{r['jobs']} jobs: {m['running']} running, {m['preempted']} preempted with the event lost (a-slow "
            f"among them), {m['waiting']} waiting for capacity; a-slow's restart hangs {r['config']['slow_seconds']:g} "
            f"s; {r['config']['concurrency']} deliveries in flight. {r['machine']}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="registered jobs besides a-slow (default 2000)")
    p.add_argument("--slow-seconds", type=float, default=60,
                   help="how long a-slow's operation hangs in each pass (default 60; the adapters wait up to 480)")
    p.add_argument("--concurrency", type=int, default=80,
                   help="deliveries in flight: the deployed max instances x concurrency (default 10 x 8 = 80)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke size: 10 jobs, 8 in flight; the fanned-out hang ends once every other job is "
                        "reconciled (at most 20 s), the serial one after 2 s")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.quick:
        # The fanned-out hang lasts until the other 10 reconciles end (a fixed 5 s did not outlast 30 on a loaded
        # 2-core machine, at load 8; 20 s is its cap): the test asserts every other job ended before it.
        args.jobs, args.slow_seconds, args.concurrency = 10, 20.0, 8
    if args.jobs < 3 or args.concurrency < 1 or args.slow_seconds <= 0:
        p.error("--jobs must be at least 3, --concurrency at least 1, --slow-seconds above 0")
    started = time.monotonic()
    try:
        result = run(args)
    except (RuntimeError, TimeoutError) as exc:
        say(f"bench.sweep: {exc}")
        return 1
    result["machine"] = machine()
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
