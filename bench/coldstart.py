"""Cold-start benchmark of the `on_log_event` Cloud Function: time and memory to import it and serve its first event,
Respawn's lazy client imports beside a naive function that imports the Google clients eagerly.

    python -m bench.coldstart [--repeats 5] [--quick] [--json] [--firestore HOST:PORT]

Every measurement is a fresh Python process (a cold interpreter, as a new function instance is), run in turn for
two variants:
  respawn   `import respawn.control.main` (which loads no Google client library), then the first event
  naive     `import bench.naive_function` (the baseline: google.cloud.compute_v1 and google.cloud.firestore imported
            at module top level, then the same entry point and handler), then the first event
The first event is served through the Functions Framework exactly as tests/functions_fixtures.py does:
`create_app(target="on_log_event", source=..., signature_type="cloudevent").test_client().post(...)`, with a
Pub/Sub CloudEvent built in the parent. Two events:
  preemption  the sim's real `compute.instances.preempted` audit LogEntry for a registered RUNNING job: the full
              recovery path (Firestore emulator + sim/ through the real clients: observe that the Spot VM with
              termination action DELETE is gone, create the replacement in the next zone, wait for RUNNING). The
              bench checks in Firestore and the sim that the job really recovered after each child, and fails if not.
  foreign     a preemption of a VM Respawn did not create ("ci-runner"): acknowledged without any cloud call.

Figures per child (measured inside it, time.perf_counter):
  import_s              the import of the function module
  first_event_s         create_app + the first POST, until its response
  total_s               import_s + first_event_s
  rss_after_import_mib  resident set size right after the import (VmRSS in /proc/self/status)
  peak_rss_mib          the process's peak resident set size at the end (VmHWM in /proc/self/status). Not
                        getrusage's ru_maxrss: on Linux that keeps the forking parent's high-water mark across exec
                        (the parent holds the clients it uses for setup, ~170 MiB), so every child would report at
                        least that much; the JSON keeps it as ru_maxrss_mib for reference
  process_s             the child's wall time seen by the parent, interpreter start and exit included
Reported: median [min–max] over the repeats; the naive/respawn ratio of the medians. The variants alternate their
order from one repeat to the next, so a load drift on the shared machine hits both. The parent starts the Firestore
emulator (unless --firestore names one) and the sim once; between children it empties Firestore and deletes the
replacement VM, and each child's job has its own id; it stops what it started, also on Ctrl-C or SIGTERM.

JSON top-level figures: `<variant>_import_s`, `_rss_after_import_mib` are medians over all of a variant's children;
`_first_event_s`, `_total_s`, `_peak_rss_mib` are the preemption event's; `events` has the per-event breakdown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "respawn-bench"
VARIANTS = {"respawn": ("respawn.control.main", "functions/main.py"),
            "naive": ("bench.naive_function", "bench/naive_function.py")}
EVENTS = ("preemption", "foreign")
METRICS = ("import_s", "first_event_s", "total_s", "rss_after_import_mib", "peak_rss_mib")
WATCHED = ("google.cloud.compute_v1", "google.cloud.firestore", "google.cloud.tpu_v2", "grpc")
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
FOREIGN_VM = "ci-runner"  # not `{job}-{attempt}`: no job can own it
OP_DELAY = 0.02  # sim seconds per lifecycle step: the replacement's PROVISIONING → STAGING → RUNNING
CHILD_TIMEOUT = 180
# Short timings as in the tests: the recovery waits on the sim's transitions, polled every 50 ms.
FUNCTION_ENV = {"RESPAWN_POLL_SECONDS": "0.05", "RESPAWN_POLL_BUDGET_SECONDS": "30",
                "RESPAWN_STALE_HEARTBEAT_SECONDS": "60", "RESPAWN_BOOT_GRACE_SECONDS": "60"}

# The child: a cold interpreter that imports the variant's function module, then serves one event. Before the clock
# starts it imports only json, os, resource, sys and time (stdlib, a few ms; both variants load json and os anyway).
CHILD = r'''
import json, os, resource, sys, time
module, source, request_path, result_path = sys.argv[1:5]
with open(request_path) as f:
    request = json.load(f)
watched = request["watched"]
def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
t0 = time.perf_counter()
__import__(module)
t1 = time.perf_counter()
rss_after_import = status_mib("VmRSS")
at_import = {m: m in sys.modules for m in watched}
n_at_import = len(sys.modules)
import functions_framework
app = functions_framework.create_app(target="on_log_event", source=source, signature_type="cloudevent")
response = app.test_client().post("/", headers=request["headers"], data=request["body"].encode())
t2 = time.perf_counter()
result = {"import_s": t1 - t0, "first_event_s": t2 - t1, "total_s": t2 - t0,
          "rss_after_import_mib": rss_after_import,
          "peak_rss_mib": status_mib("VmHWM"),
          "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "status": response.status_code, "modules_at_import": at_import,
          "modules_after_event": {m: m in sys.modules for m in watched},
          "n_modules_at_import": n_at_import, "n_modules_after_event": len(sys.modules)}
with open(result_path, "w") as f:
    json.dump(result, f)
'''


class BenchError(RuntimeError):
    pass


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _spec(job_id: str) -> dict:
    return {"id": job_id, "provisioning": "spot", "zones": list(ZONES), "termination_action": "DELETE",
            "accelerator": {"kind": "gpu", "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4"},
            "trainer": {"command": ["python", "-m", "respawn.ckpt.examples.torch_mlp"]},
            "checkpoint_uri": f"gs://respawn-bench/{job_id}", "max_failures": 5}


class Bench:
    """The emulator, the sim and the parent's clients; prepares each event and checks what the child did."""

    def __init__(self, firestore_host: str | None, work: Path):
        self.work = work
        self.emulator = None
        self.sim = None
        self.child: subprocess.Popen | None = None
        self.firestore_host = firestore_host
        self.env: dict[str, str] = {}

    def start(self) -> None:
        from sim import emulators
        from sim.server import SimServer

        if self.firestore_host is None:
            _progress("starting the Firestore emulator ...")
            self.emulator = emulators.start_firestore()
            self.firestore_host = self.emulator.host
        self.sim = SimServer(PROJECT, notice_seconds=1.0, op_delay=OP_DELAY, nodes_root=self.work / "nodes").start()
        self.env = {"RESPAWN_PROJECT": PROJECT, "FIRESTORE_EMULATOR_HOST": self.firestore_host,
                    "RESPAWN_COMPUTE_ENDPOINT": self.sim.endpoint, "RESPAWN_TPU_ENDPOINT": self.sim.endpoint,
                    **FUNCTION_ENV}
        # The parent registers jobs and brings them to RUNNING through the same handler, on the same endpoints.
        os.environ.update(self.env)
        for name in ("RESPAWN_ALERTS_TOPIC", "SLACK_WEBHOOK_URL"):  # alerts are only logged: no Pub/Sub in the way
            os.environ.pop(name, None)
        from google.cloud import firestore

        from respawn.schema import NODES_DATABASE

        self.db = firestore.Client(project=PROJECT)
        self.nodes_db = firestore.Client(project=PROJECT, database=NODES_DATABASE)

    def stop(self) -> None:
        from sim.emulators import stop_group

        if self.child is not None and self.child.poll() is None:
            stop_group(self.child, timeout=5)
        if self.sim is not None:
            self.sim.stop()
        if self.emulator is not None:
            self.emulator.stop()

    # --- events -----------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        from sim.emulators import reset_firestore

        reset_firestore(self.firestore_host, PROJECT)

    @staticmethod
    def _request(entry: dict) -> dict:
        """The Pub/Sub push the Logging sink's topic makes: a structured CloudEvent whose message data is the entry."""
        from sim.bridges import pubsub_cloudevent

        headers, body = pubsub_cloudevent(json.dumps(entry).encode(), f"projects/{PROJECT}/topics/preemptions")
        return {"headers": dict(headers), "body": body.decode(), "watched": list(WATCHED)}

    def prepare_preemption(self, job_id: str) -> dict:
        """Register a job, place it (RUNNING), give it a heartbeat, preempt its VM; the sim's audit entry."""
        from google.cloud import firestore

        from respawn.control import handlers
        from respawn import audit
        from respawn.schema import JOBS, NODES, parse_spec

        self._reset()
        self.db.collection(JOBS).document(job_id).create({
            "spec": parse_spec(_spec(job_id)).to_doc(), "status": {"state": "PENDING", "revision": 0},
            "cancel_requested": False, "created_at": firestore.SERVER_TIMESTAMP})
        handlers.job_created(job_id)
        status = self._status(job_id)
        if status.get("state") != "RUNNING" or status.get("node") != f"{job_id}-1":
            raise BenchError(f"setup: job {job_id} did not reach RUNNING on {job_id}-1 through handlers.job_created "
                             f"(status {status}); run tests/test_functions_lifecycle.py to see why")
        node, zone = status["node"], status["zone"]
        self.nodes_db.collection(NODES).document(node).set({
            "job_id": job_id, "attempt": 1, "state": "training", "step": 100, "committed_step": 96,
            "heartbeat_at": firestore.SERVER_TIMESTAMP})
        self.sim.preempt(zone, node)

        def entries():
            return [e for e in list(self.sim.audit_log) if audit.matches(e, PROJECT)
                    and e["protoPayload"]["resourceName"].endswith(f"/instances/{node}")]

        self.sim.wait_for(lambda: bool(entries()), timeout=30, what=f"the preemption audit entry of {node}")
        return self._request(entries()[-1])

    def check_recovered(self, job_id: str) -> str:
        """'' if the job is RUNNING on its replacement in the next zone and no other node of it is live; else why."""
        status = self._status(job_id)
        want = {"state": "RUNNING", "attempt": 2, "node": f"{job_id}-2", "zone": ZONES[1], "last_cause": "preempted"}
        got = {k: status.get(k) for k in want}
        live = sorted(n["name"] for n in self.sim.live_nodes(job_id))
        if got != want or live != [f"{job_id}-2"]:
            return f"job status {got} (want {want}), live nodes {live} (want ['{job_id}-2'])"
        return ""

    def clean(self, job_id: str) -> None:
        """Delete the replacement VM so that the sim holds no node of this job for the next child."""
        from respawn.control.reconcile import Deps

        Deps.default().providers["gpu"].delete(ZONES[1], f"{job_id}-2")

    def prepare_foreign(self) -> dict:
        from sim import audit_entries

        self._reset()
        return self._request(audit_entries.compute_system_event(
            "compute.instances.preempted", project=PROJECT, zone=ZONES[0], instance_name=FOREIGN_VM,
            instance_id="4242424242424242424"))

    def _status(self, job_id: str) -> dict:
        from respawn.schema import JOBS

        doc = self.db.collection(JOBS).document(job_id).get().to_dict() or {}
        return doc.get("status") or {}

    # --- the child --------------------------------------------------------------------------------------------

    def run_child(self, variant: str, request: dict, tag: str) -> dict:
        from sim.emulators import stop_group

        module, source = VARIANTS[variant]
        request_path, result_path = self.work / f"{tag}.request.json", self.work / f"{tag}.result.json"
        log_path = self.work / f"{tag}.log"
        request_path.write_text(json.dumps(request))
        env = {**os.environ, **self.env}
        for name in ("PYTHONPROFILEIMPORTTIME", "PYTHONSTARTUP", "RESPAWN_ALERTS_TOPIC", "SLACK_WEBHOOK_URL"):
            env.pop(name, None)
        with open(log_path, "wb") as log:
            t0 = time.perf_counter()
            self.child = subprocess.Popen(
                [sys.executable, "-c", CHILD, module, source, str(request_path), str(result_path)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                rc = self.child.wait(timeout=CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                stop_group(self.child, timeout=5)
                raise BenchError(f"{tag}: the child ran past {CHILD_TIMEOUT} s and was stopped; its output:\n"
                                 f"{_tail(log_path)}") from None
            process_s = time.perf_counter() - t0
        self.child = None
        if rc != 0 or not result_path.exists():
            raise BenchError(f"{tag}: the child exited with code {rc}; its output:\n{_tail(log_path)}")
        result = json.loads(result_path.read_text())
        if result["status"] != 200:
            raise BenchError(f"{tag}: on_log_event answered HTTP {result['status']} (want 200); the function's "
                             f"output:\n{_tail(log_path)}")
        result["process_s"] = process_s
        result["log"] = str(log_path)
        return result


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no output)"


def _stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(v, 4) for v in values]}


def summarize(runs: dict, repeats: int) -> dict:
    """runs[event][variant] = the children's results → the JSON object."""
    events: dict = {}
    for event in EVENTS:
        events[event] = {}
        for variant in VARIANTS:
            rs = runs[event][variant]
            entry = {m: _stats([r[m] for r in rs]) for m in METRICS + ("process_s", "ru_maxrss_mib", "n_modules_at_import",
                                                                "n_modules_after_event")}
            for when in ("modules_at_import", "modules_after_event"):
                entry[when] = {m: any(r[when][m] for r in rs) for m in WATCHED}  # true if any child had it loaded
            if event == "preemption":
                entry["recovered"] = all(r["recovered"] for r in rs)
            else:
                entry["acknowledged"] = all(r["status"] == 200 for r in rs)
            events[event][variant] = entry
    ratios = {event: {m: round(events[event]["naive"][m]["median"] / events[event]["respawn"][m]["median"], 2)
                      for m in METRICS + ("process_s",)} for event in EVENTS}
    out: dict = {"repeats": repeats, "python": sys.version.split()[0], "cpus": os.cpu_count(), "op_delay_s": OP_DELAY}
    for variant in VARIANTS:
        every = [r for event in EVENTS for r in runs[event][variant]]
        out[f"{variant}_import_s"] = round(statistics.median(r["import_s"] for r in every), 4)
        out[f"{variant}_rss_after_import_mib"] = round(statistics.median(r["rss_after_import_mib"] for r in every), 1)
        pre = events["preemption"][variant]
        out[f"{variant}_first_event_s"] = pre["first_event_s"]["median"]
        out[f"{variant}_total_s"] = pre["total_s"]["median"]
        out[f"{variant}_peak_rss_mib"] = round(pre["peak_rss_mib"]["median"], 1)
        out[f"{variant}_recovered"] = pre["recovered"]
        out[f"{variant}_compute_v1_at_import"] = any(r["modules_at_import"]["google.cloud.compute_v1"] for r in every)
    out["events"] = events
    out["ratios"] = ratios
    return out


def table(result: dict) -> str:
    def cell(s: dict, digits: int) -> str:
        return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"

    columns = METRICS + ("process_s",)
    header = ("variant", "event") + columns
    rows = [header]
    for event in EVENTS:
        for variant in VARIANTS:
            e = result["events"][event][variant]
            rows.append((variant, event) + tuple(cell(e[m], 3 if m.endswith("_s") else 0) for m in columns))
    for event in EVENTS:
        rows.append(("naive/respawn", event) + tuple(f"{result['ratios'][event][m]:.2f}x" for m in columns))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(2 + 2 * len(EVENTS), "-" * len(lines[0]))
    loaded = {v: [m for m, on in result["events"]["preemption"][v]["modules_at_import"].items() if on]
              for v in VARIANTS}
    lines += ["",
              f"median [min-max] of {result['repeats']} fresh processes each; seconds and MiB; "
              f"Python {result['python']}, {result['cpus']} CPUs",
              "process_s: the child's wall time seen by the parent (interpreter start and exit included)",
              "loaded by the import: " + "; ".join(f"{v}: {', '.join(m) or 'no Google client'}" for v, m in loaded.items()),
              "preemption recovered in every child: " + ", ".join(
                  f"{v} {'yes' if result['events']['preemption'][v]['recovered'] else 'NO'}" for v in VARIANTS)]
    return "\n".join(lines)


def measure(bench: Bench, repeats: int) -> dict:
    """runs[event][variant]: one child's result per repeat. Raises BenchError if a preemption did not recover."""
    runs: dict = {event: {variant: [] for variant in VARIANTS} for event in EVENTS}
    for r in range(1, repeats + 1):
        order = list(VARIANTS) if r % 2 else list(reversed(VARIANTS))
        for variant in order:
            for event in EVENTS:
                tag = f"r{r}-{variant}-{event}"
                job_id = f"cold-{r}-{variant}"
                _progress(f"repeat {r}/{repeats}: {variant} {event} ...")
                request = bench.prepare_preemption(job_id) if event == "preemption" else bench.prepare_foreign()
                result = bench.run_child(variant, request, tag)
                if event == "preemption":
                    why = bench.check_recovered(job_id)
                    if why:
                        raise BenchError(f"{tag}: the preemption was served (HTTP 200) but the job did not recover: "
                                         f"{why}. The function's output:\n{_tail(Path(result['log']))}")
                    result["recovered"] = True
                    bench.clean(job_id)
                runs[event][variant].append(result)
                _progress(f"repeat {r}/{repeats}: {variant} {event}: import {result['import_s']:.3f} s, first event "
                          f"{result['first_event_s']:.3f} s, peak RSS {result['peak_rss_mib']:.0f} MiB")
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per variant and event (default 5)")
    p.add_argument("--quick", action="store_true", help="one repeat, for CI")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--firestore", metavar="HOST:PORT", default=None,
                   help=f"use this running Firestore emulator (project {PROJECT} is emptied) instead of starting one")
    args = p.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    if repeats < 1:
        p.error("--repeats must be at least 1")

    # SIGTERM ends the run like Ctrl-C: the finally below stops the child, the sim and the emulator.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from sim.emulators import EmulatorError

    work = Path(tempfile.mkdtemp(prefix="respawn-coldstart-"))
    bench = Bench(args.firestore, work)
    keep = True  # the work directory stays for a failure's post-mortem; a success or an interrupt removes it
    try:
        # The parent's own function calls (placing each job) log to stdout; keep them out of the table/JSON.
        with open(work / "parent.log", "w") as parent_log, contextlib.redirect_stdout(parent_log):
            bench.start()
            runs = measure(bench, repeats)
        keep = False
    except (BenchError, EmulatorError, TimeoutError) as exc:
        _progress(f"coldstart benchmark failed: {exc}")
        return 1
    except (KeyboardInterrupt, SystemExit) as exc:
        keep = False
        _progress("coldstart benchmark interrupted; stopping what it started")
        return 130 if isinstance(exc, KeyboardInterrupt) else exc.code
    finally:
        bench.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            _progress(f"the children's requests, results and output, and the parent's log, are kept in {work}")
    result = summarize(runs, repeats)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
