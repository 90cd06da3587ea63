"""Controller benchmark: on_log_event latency, Firestore operations per recovery, and a preemption storm, beside
the seeds' restart function in the same run. `python -m bench.controller [--quick] [--json]`.

Everything is local and real: the Firestore and Pub/Sub emulators, sim/ with instant cloud latencies (operations
take no time, no preemption notice) so that the controller's own cost shows, and the functions served in-process
by the Functions Framework, as a warm instance serves them, reached through the real Compute client.

Latency: --events preemptions, one at a time, of --latency-jobs running jobs (after --warmup uncounted ones).
  p50_ms, p99_ms        on_log_event handling time of one event: the whole recovery (observe, record, restart in
                        place or replace the node, see the API say RUNNING, record, publish the alert)
  reads_per_recovery    Firestore document reads and writes per recovery, from reconcile's own count
  writes_per_recovery   (its "reconcile finished" log line)
Storm: --jobs running jobs in one zone, all preempted at once; then that zone has room for ROOMS[0] more nodes, the
next for ROOMS[1], the third for ROOMS[2] (--rooms 0,150,100). Events reach the function as the Logging sink and
Pub/Sub deliver them: --concurrency in flight (the deployed max 10 instances x concurrency 8), --duplicate-rate of
them twice (at-least-once), a failed delivery again after 1 s (--retry). Jobs still not running when every delivery
is done get one sweep, as Cloud Scheduler would send.
  storm_seconds         preemption to the moment the last job's node is RUNNING (sim clock; null if one never is)
  storm_recovered       jobs with a RUNNING node at the end
  double_provisioned    jobs that ever had two nodes live at once
Baseline: bench/seed_restart.py, what the seeds do per event: wait --baseline-wait seconds (their 60 s), then start
or recreate the node in the same zone. Each event gets its own instance (the seeds deploy with default scaling).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import functions_framework
from google.cloud import firestore
from google.cloud import pubsub_v1

from respawn.control import clients
from respawn.control.adapters.compute import ComputeProvider
from respawn.control.settings import ControlSettings
from respawn.app.jobstore import JobStore
from respawn import audit
from respawn.schema import JOBS, NODES_DATABASE, node_name, parse_spec
from sim import emulators
from sim.bridges import PushRelay, cloudevent_headers, document_event_data, pubsub_cloudevent
from sim.server import SimServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = "respawn-bench"
T4 = "nvidia-tesla-t4"
LATENCY_ZONES = ["us-east1-b", "us-east1-c", "us-east1-d"]
STORM_ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
SEED_ZONES = ["europe-west4-a", "europe-west4-b", "europe-west4-c"]
ALERTS_TOPIC = "respawn-alerts"
SWEEP_TOPIC = "respawn-sweep"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def spec_doc(job_id: str, zones: list[str]) -> dict[str, Any]:
    return {
        "id": job_id,
        "accelerator": {"kind": "gpu", "machine_type": "n1-standard-8", "accelerator_type": T4},
        "provisioning": "spot",
        "zones": list(zones),
        "trainer": {"command": ["python", "train.py"]},
        "checkpoint_uri": f"gs://respawn-bench/{job_id}",
        "max_failures": 10_000,
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


class LogCapture(io.TextIOBase):
    """Stands in for sys.stdout while the functions run: their JSON log lines are kept, not printed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunks: list[str] = []

    def write(self, s: str) -> int:
        with self._lock:
            self._chunks.append(s)
        return len(s)

    def take(self) -> list[dict]:
        with self._lock:
            text, self._chunks = "".join(self._chunks), []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


@contextmanager
def captured_stdout(capture: LogCapture):
    saved, sys.stdout = sys.stdout, capture
    try:
        yield capture
    finally:
        sys.stdout = saved


def firestore_ops(lines: list[dict]) -> tuple[int, int]:
    done = [l for l in lines if l.get("message", "").endswith("reconcile finished")]
    return sum(l.get("firestore_reads", 0) for l in done), sum(l.get("firestore_writes", 0) for l in done)


class Cloud:
    """The emulators, the sim (instant latencies) and the functions, served in-process."""

    def __init__(self, stack: ExitStack, log_dir: str, *, metadata_servers: bool = True):
        say("starting the Firestore and Pub/Sub emulators and the sim ...")
        firestore_emulator = emulators.start_firestore(log_dir=Path(log_dir))
        stack.callback(firestore_emulator.stop)
        pubsub = emulators.start_pubsub(log_dir=Path(log_dir))
        stack.callback(pubsub.stop)
        self.entries: queue.Queue = queue.Queue()
        self.sim = SimServer(PROJECT, notice_seconds=0, op_delay=0, audit_sink=self._sink,
                             metadata_servers=metadata_servers).start()
        stack.callback(self.sim.stop)
        os.environ.update({
            "FIRESTORE_EMULATOR_HOST": firestore_emulator.host, "PUBSUB_EMULATOR_HOST": pubsub.host,
            "RESPAWN_PROJECT": PROJECT, "RESPAWN_COMPUTE_ENDPOINT": self.sim.endpoint,
            "RESPAWN_TPU_ENDPOINT": self.sim.endpoint, "RESPAWN_ALERTS_TOPIC": ALERTS_TOPIC,
            "RESPAWN_SWEEP_TOPIC": SWEEP_TOPIC,
            # A transition under way is looked at again after 20 ms instead of 5 s: the sim has none to wait for.
            "RESPAWN_POLL_SECONDS": "0.02",
        })
        pubsub_v1.PublisherClient().create_topic(name=f"projects/{PROJECT}/topics/{ALERTS_TOPIC}")
        self.db = firestore.Client(project=PROJECT)
        self.nodes_db = firestore.Client(project=PROJECT, database=NODES_DATABASE)
        self.apps = {
            "on_job_created": functions_framework.create_app(target="on_job_created", source=f"{ROOT}/functions/main.py",
                                                             signature_type="cloudevent"),
            "on_log_event": functions_framework.create_app(target="on_log_event", source=f"{ROOT}/functions/main.py",
                                                           signature_type="cloudevent"),
            "on_sweep": functions_framework.create_app(target="on_sweep", source=f"{ROOT}/functions/main.py",
                                                       signature_type="cloudevent"),
            "seed": functions_framework.create_app(target="restart_preempted_instance",
                                                   source=f"{ROOT}/bench/seed_restart.py", signature_type="cloudevent"),
        }
        # The sweep topic's push subscription: the tick's one message per job comes back to on_sweep.
        self.sweep_relay = PushRelay(PROJECT, SWEEP_TOPIC, lambda h, b: self.post("on_sweep", h, b))
        # The seeds' function fails on every stocked-out zone by design; its tracebacks would drown the progress.
        # (Respawn's functions keep theirs: an exception there is worth seeing.)
        self.apps["seed"].logger.disabled = True

    def _sink(self, entry: dict) -> None:
        if audit.matches(entry, PROJECT):  # what the Logging sink's filter lets through
            self.entries.put(entry)

    def post(self, app: str, headers: dict, body: bytes) -> int:
        return self.apps[app].test_client().post("/", headers=headers, data=body).status_code

    def log_event(self, app: str, entry: dict) -> int:
        return self.post(app, *pubsub_cloudevent(json.dumps(entry).encode()))

    def job_created(self, job_id: str) -> int:
        snap = self.db.collection(JOBS).document(job_id).get()
        return self.post("on_job_created", cloudevent_headers(PROJECT, f"{JOBS}/{job_id}"),
                         document_event_data(snap, PROJECT))

    def sweep(self) -> int:
        """Cloud Scheduler's tick, then every job's message it fanned out; the first non-200 status, else 200."""
        statuses = [self.post("on_sweep", *pubsub_cloudevent(b'{"task": "sweep"}'))]
        statuses += [status for _, status in self.sweep_relay.drain()]
        return next((s for s in statuses if s != 200), 200)

    def status(self, job_id: str) -> dict:
        return (self.db.collection(JOBS).document(job_id).get().to_dict() or {}).get("status") or {}

    def next_entry(self, timeout: float = 30) -> dict:
        try:
            return self.entries.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"no audit entry from the sim within {timeout:.0f} s of a preemption") from None


def parallel(n: int, items: list, work: Callable[[Any], Any], what: str) -> list:
    """Run work(item) for every item on n threads, with progress every second; the results in order."""
    done = [0]
    lock = threading.Lock()
    results: list = [None] * len(items)
    last = [time.monotonic()]

    def one(i: int) -> None:
        results[i] = work(items[i])
        with lock:
            done[0] += 1
            if time.monotonic() - last[0] > 1 or done[0] == len(items):
                last[0] = time.monotonic()
                say(f"  {what}: {done[0]}/{len(items)}")

    with ThreadPoolExecutor(max_workers=n) as pool:
        for f in [pool.submit(one, i) for i in range(len(items))]:
            f.result()
    return results


def start_respawn_jobs(cloud: Cloud, prefix: str, count: int, zones: list[str], concurrency: int) -> list[str]:
    """Register `count` jobs and let on_job_created place each one (in zones[0], which has room)."""
    ids = [f"{prefix}-{i:03d}" for i in range(count)]
    for job_id in ids:
        JobStore(cloud.db).register(job_id, parse_spec(spec_doc(job_id, zones)).to_doc(), source="bench")
    capture = LogCapture()
    with captured_stdout(capture):
        codes = parallel(concurrency, ids, cloud.job_created, f"starting {prefix} jobs")
    bad = [(j, c) for j, c in zip(ids, codes) if c != 200]
    not_running = [j for j in ids if cloud.status(j).get("state") != "RUNNING"]
    if bad or not_running:
        raise RuntimeError(f"setup failed: {len(bad)} on_job_created deliveries answered non-200 {bad[:3]}, "
                           f"{len(not_running)} jobs not RUNNING {not_running[:3]}; see the emulator logs")
    return ids


def start_seed_nodes(cloud: Cloud, prefix: str, count: int, zone: str, concurrency: int) -> list[str]:
    """The baseline's nodes: created directly (the seeds launch them by hand), named and labelled as Respawn's."""
    settings = ControlSettings.from_env()
    provider = ComputeProvider(clients.default(settings), op_timeout=settings.compute_op_timeout_seconds,
                               nodes=settings.nodes)
    ids = [f"{prefix}-{i:03d}" for i in range(count)]
    parallel(concurrency, ids, lambda j: provider.create(parse_spec(spec_doc(j, SEED_ZONES)), zone, node_name(j, 1), 1,
                                                         "spot", ""), f"starting {prefix} nodes")
    return ids


# --- latency --------------------------------------------------------------------------------------------------


def measure_latency(cloud: Cloud, events: int, warmup: int, job_count: int) -> dict[str, Any]:
    say(f"latency: {job_count} running jobs, {warmup} warm-up + {events} measured preemptions, one at a time")
    ids = start_respawn_jobs(cloud, "lat", job_count, LATENCY_ZONES, concurrency=min(job_count, 8))
    times, reads, writes, failures = [], [], [], []
    capture = LogCapture()
    for i in range(warmup + events):
        job_id = ids[i % len(ids)]
        status = cloud.status(job_id)
        while not cloud.entries.empty():  # only this preemption's entry counts
            cloud.entries.get_nowait()
        cloud.sim.preempt(status["zone"], status["node"])
        entry = cloud.next_entry()
        with captured_stdout(capture):
            t0 = time.perf_counter()
            code = cloud.log_event("on_log_event", entry)
            elapsed = time.perf_counter() - t0
        r, w = firestore_ops(capture.take())
        after = cloud.status(job_id)
        if code != 200 or after.get("state") != "RUNNING" or after.get("attempt", 0) == 0:
            failures.append(f"{job_id}: HTTP {code}, state {after.get('state')}")
        if i >= warmup:
            times.append(elapsed * 1000)
            reads.append(r)
            writes.append(w)
        if (i + 1) % 10 == 0 or i + 1 == warmup + events:
            say(f"  latency: {i + 1}/{warmup + events} events, last {elapsed * 1000:.0f} ms")
    if failures:
        raise RuntimeError(f"{len(failures)} of {warmup + events} latency events did not end with the job RUNNING: "
                           f"{failures[:3]}")
    return {
        "p50_ms": round(percentile(times, 50), 1), "p99_ms": round(percentile(times, 99), 1),
        "mean_ms": round(statistics.fmean(times), 1), "events": events,
        "reads_per_recovery": round(statistics.fmean(reads), 2), "writes_per_recovery": round(statistics.fmean(writes), 2),
    }


# --- storm ----------------------------------------------------------------------------------------------------


@dataclass
class StormResult:
    jobs: int
    recovered: int
    double_provisioned: int
    seconds: float | None
    zones: dict[str, int]
    event_ms: list[float] = field(default_factory=list)
    deliveries: int = 0
    failed: int = 0
    redeliveries: int = 0
    sweeps: int = 0
    reads: int = 0
    writes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "storm_jobs": self.jobs, "storm_recovered": self.recovered, "double_provisioned": self.double_provisioned,
            "storm_seconds": None if self.seconds is None else round(self.seconds, 2), "storm_zones": self.zones,
            "storm_event_p50_ms": round(percentile(self.event_ms, 50), 1) if self.event_ms else None,
            "storm_event_p99_ms": round(percentile(self.event_ms, 99), 1) if self.event_ms else None,
            "storm_deliveries": self.deliveries, "storm_failed_deliveries": self.failed,
            "storm_redeliveries": self.redeliveries, "storm_sweeps": self.sweeps,
        }


def storm(cloud: Cloud, app: str, ids: list[str], zones: list[str], rooms: list[int], *, concurrency: int,
          duplicate_rate: float, retry: bool, label: str, seed: int = 0) -> StormResult:
    """Preempt every job's node in zones[0] at once and deliver the events to `app`; read the outcome off the sim."""
    sim = cloud.sim
    wanted = set(ids)
    nodes = {i["labels"].get("respawn-job"): i["name"] for i in sim.instances()
             if i["zone"] == zones[0] and i["status"] == "RUNNING" and i["labels"].get("respawn-job") in wanted}
    if len(nodes) != len(ids):
        raise RuntimeError(f"{label}: {len(ids) - len(nodes)} jobs have no running node in {zones[0]} before the storm")
    rng = random.Random(seed)
    capture = LogCapture()
    lock = threading.Lock()
    result = StormResult(jobs=len(ids), recovered=0, double_provisioned=0, seconds=None, zones={})

    def deliver(entry: dict) -> None:
        for attempt in range(6):
            t0 = time.perf_counter()
            code = cloud.log_event(app, entry)
            with lock:
                result.event_ms.append((time.perf_counter() - t0) * 1000)
                result.deliveries += 1
                result.redeliveries += attempt > 0
                result.failed += code != 200
            if code == 200 or not retry:
                return
            time.sleep(1)

    say(f"storm ({label}): {len(ids)} nodes in {zones[0]} preempted at once; room after it: "
        + ", ".join(f"{z} {r}" for z, r in zip(zones, rooms)))
    for zone, room in zip(zones, rooms):
        sim.set_capacity(zone, T4, room)
    t0 = sim.now()
    stop = threading.Event()
    monitor = threading.Thread(target=_progress, args=(sim, wanted, t0, stop, label), daemon=True)
    with captured_stdout(capture), ThreadPoolExecutor(max_workers=concurrency) as pool:
        monitor.start()
        for job_id in ids:
            sim.preempt(zones[0], nodes[job_id])
        futures = []
        for _ in ids:
            entry = cloud.next_entry()
            futures.append(pool.submit(deliver, entry))
            if rng.random() < duplicate_rate:
                futures.append(pool.submit(deliver, entry))
        for f in futures:
            f.result()
        if app == "on_log_event" and any(cloud.status(j).get("state") != "RUNNING" for j in ids):
            cloud.sweep()
            result.sweeps += 1
        stop.set()
        monitor.join()
    result.reads, result.writes = firestore_ops(capture.take())

    firsts = []
    history = sim.history()
    for job_id in ids:
        mine = [r for r in history if r["labels"].get("respawn-job") == job_id]
        live = [r for r in mine if r["live"] and r["live"][-1][1] is None and r["states"][-1][1] == "RUNNING"]
        running_at = [t for r in mine for t, s in r["states"] if s == "RUNNING" and t >= t0]
        if live and running_at:
            result.recovered += 1
            firsts.append(min(running_at) - t0)
            result.zones[live[-1]["zone"]] = result.zones.get(live[-1]["zone"], 0) + 1
        if sim.max_live(job_id) > 1:
            result.double_provisioned += 1
    if firsts and result.recovered == len(ids):
        result.seconds = max(firsts)
    return result


def _progress(sim, ids: set, t0: float, stop: threading.Event, label: str) -> None:
    while not stop.wait(1.0):
        running = {i["labels"].get("respawn-job") for i in sim.instances() if i["status"] == "RUNNING"} & ids
        say(f"  storm ({label}): {len(running)}/{len(ids)} running, {sim.now() - t0:.1f} s")


# --- report ---------------------------------------------------------------------------------------------------


def report(r: dict[str, Any]) -> str:
    b = r["baseline"]

    def secs(v):
        return "never" if v is None else f"{v:.1f} s"

    def ratio(a, c):
        return f"{c / a:.0f}x" if a and c else "-"

    rows = [
        ("on_log_event p50 (warm, 1 event)", f"{r['p50_ms']:.0f} ms", "-", ""),
        ("on_log_event p99 (warm, 1 event)", f"{r['p99_ms']:.0f} ms", "-", ""),
        ("Firestore reads per recovery", f"{r['reads_per_recovery']:.1f}", "0", ""),
        ("Firestore writes per recovery", f"{r['writes_per_recovery']:.1f}", "0", ""),
        ("storm: per-event p50", f"{r['storm_event_p50_ms']:.0f} ms", f"{b['storm_event_p50_ms']:.0f} ms",
         ratio(r["storm_event_p50_ms"], b["storm_event_p50_ms"])),
        ("storm: per-event p99", f"{r['storm_event_p99_ms']:.0f} ms", f"{b['storm_event_p99_ms']:.0f} ms",
         ratio(r["storm_event_p99_ms"], b["storm_event_p99_ms"])),
        ("storm: recovered", f"{r['storm_recovered']}/{r['storm_jobs']}", f"{b['storm_recovered']}/{b['storm_jobs']}", ""),
        ("storm: double-provisioned jobs", str(r["double_provisioned"]), str(b["double_provisioned"]), ""),
        ("storm: time to last running", secs(r["storm_seconds"]), secs(b["storm_seconds"]),
         ratio(r["storm_seconds"], b["storm_seconds"])),
        ("storm: recovered per zone", _zones(r["storm_zones"]), _zones(b["storm_zones"]) or "none", ""),
        ("storm: Firestore reads/writes per job", f"{r['storm_reads_per_job']:.1f} / {r['storm_writes_per_job']:.1f}",
         "0 / 0", ""),
        ("storm: deliveries (failed, sweeps)",
         f"{r['storm_deliveries']} ({r['storm_failed_deliveries']}, {r['storm_sweeps']})",
         f"{b['storm_deliveries']} ({b['storm_failed_deliveries']}, -)", ""),
    ]
    w0 = max(len(x[0]) for x in rows)
    w1 = max(len(x[1]) for x in rows + [("", "Respawn")])
    w2 = max(len(x[2]) for x in rows + [("", "", "seeds' function")])
    out = [f"{'':<{w0}}  {'Respawn':>{w1}}  {'seeds function':>{w2}}  ratio"]
    out += [f"{a:<{w0}}  {b_:>{w1}}  {c:>{w2}}  {d}" for a, b_, c, d in rows]
    c = r["config"]
    out.append("")
    out.append(f"{c['events']} latency events; storm of {c['jobs']} jobs, rooms {c['rooms']}, concurrency "
               f"{c['concurrency']}, duplicate rate {c['duplicate_rate']}; baseline waits {c['baseline_wait']} s per "
               f"event. {r['machine']}")
    return "\n".join(out)


def _zones(z: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(z.items()))


def machine() -> str:
    """Where a benchmark ran, for its figures: host, CPUs, Python, date."""
    return (f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{datetime.now(timezone.utc):%Y-%m-%d}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200, help="measured latency events (default 200)")
    p.add_argument("--warmup", type=int, default=5, help="uncounted first events (default 5)")
    p.add_argument("--latency-jobs", type=int, default=10, help="jobs the latency events rotate over (default 10)")
    p.add_argument("--jobs", type=int, default=200, help="jobs in the storm (default 200)")
    p.add_argument("--rooms", default="0,150,100",
                   help="room after the storm in the preempting zone, the next and the third (default 0,150,100)")
    p.add_argument("--concurrency", type=int, default=80,
                   help="events in flight: the deployed max instances x concurrency (default 10 x 8 = 80)")
    p.add_argument("--duplicate-rate", type=float, default=0.1, help="share of events delivered twice (default 0.1)")
    p.add_argument("--baseline-wait", type=float, default=60, help="the seeds' wait per event in seconds (default 60)")
    p.add_argument("--quick", action="store_true", help="CI smoke size: 5 events, a storm of 10 jobs, 1 s wait")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.quick:
        args.events, args.warmup, args.latency_jobs, args.jobs = 5, 1, 3, 10
        args.rooms, args.concurrency, args.baseline_wait = "0,6,5", 8, 1.0
    try:
        rooms = [int(x) for x in args.rooms.split(",")]
        if len(rooms) != 3 or min(rooms) < 0:
            raise ValueError
    except ValueError:
        p.error(f"--rooms takes three non-negative counts like 0,150,100, not {args.rooms!r}")
    if args.events < 1 or args.jobs < 1 or args.latency_jobs < 1 or args.concurrency < 1:
        p.error("--events, --jobs, --latency-jobs and --concurrency must be at least 1")
    if not 0 <= args.duplicate_rate <= 1:
        p.error("--duplicate-rate is a share between 0 and 1")

    os.environ["SEED_WAIT_SECONDS"] = str(args.baseline_wait)
    os.environ["SEED_TEMPLATE"] = json.dumps(spec_doc("template", SEED_ZONES))
    started = time.monotonic()
    try:
        result = run(args, rooms)
    except (emulators.EmulatorError, RuntimeError) as exc:
        say(f"bench.controller: {exc}")
        return 1
    result["machine"] = machine()
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result) if args.json else report(result))
    return 0


def run(args: argparse.Namespace, rooms: list[int]) -> dict[str, Any]:
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="respawn-bench-") as tmp:
        cloud = Cloud(stack, tmp)
        result: dict[str, Any] = measure_latency(cloud, args.events, args.warmup, args.latency_jobs)

        ids = start_respawn_jobs(cloud, "storm", args.jobs, STORM_ZONES, concurrency=min(args.concurrency, 16))
        ours = storm(cloud, "on_log_event", ids, STORM_ZONES, rooms, concurrency=args.concurrency,
                     duplicate_rate=args.duplicate_rate, retry=True, label="Respawn")
        result.update(ours.as_dict())
        result["storm_reads_per_job"] = round(ours.reads / ours.jobs, 2)
        result["storm_writes_per_job"] = round(ours.writes / ours.jobs, 2)

        seed_ids = start_seed_nodes(cloud, "seed", args.jobs, SEED_ZONES[0], concurrency=min(args.concurrency, 16))
        theirs = storm(cloud, "seed", seed_ids, SEED_ZONES, rooms, concurrency=2 * args.jobs,
                       duplicate_rate=args.duplicate_rate, retry=False, label="seeds")
        result["baseline"] = theirs.as_dict()
    result["config"] = {"events": args.events, "warmup": args.warmup, "latency_jobs": args.latency_jobs,
                        "jobs": args.jobs, "rooms": rooms, "concurrency": args.concurrency,
                        "duplicate_rate": args.duplicate_rate, "baseline_wait": args.baseline_wait}
    return result


if __name__ == "__main__":
    sys.exit(main())
