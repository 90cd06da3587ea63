"""What the Java emulators' JIT options (sim.emulators.JVM_OPTIONS) save: the Firestore emulator's CPU and wall time on
one workload, started with the JVM's defaults and with the harness's options, in the same run.

The workload is the traffic a demo puts on the emulator: heartbeat-sized merge writes to a few job documents, a read
after every third write, and a query over the collection every 50. The CPU is the emulator's whole process group
(the launcher and its java child), read from /proc after the workload and an idle tail, so it includes the JIT's
compiling and the garbage collector's threads.

    python -m bench.emulator_jit            # 3,000 writes a variant (about 1 min)
    python -m bench.emulator_jit --quick    # 100 writes, CI's smoke size
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sim import emulators

JOBS = 50
IDLE_TAIL_S = 5  # the JIT and the GC keep working after the last request: their CPU counts too (--quick: 1 s)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of every live process in the process group `pgid`."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[2] is the pgrp (stat's 5th field)
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def workload(host: str, writes: int) -> float:
    from google.cloud import firestore

    os.environ["FIRESTORE_EMULATOR_HOST"] = host
    db = firestore.Client(project="bench-emulator-jit")
    jobs = db.collection("jobs")
    begin = time.monotonic()
    for i in range(writes):
        doc = jobs.document(f"job-{i % JOBS}")
        doc.set({"heartbeat": {"step": i, "state": "training", "detail": "x" * 100}}, merge=True)
        if i % 3 == 0:
            doc.get()
        if i % 50 == 0:
            list(jobs.stream())
    seconds = time.monotonic() - begin
    db.close()
    return seconds


def measure(jvm_options: str, writes: int, idle_tail_s: float) -> dict:
    started = time.monotonic()
    emu = emulators.start_firestore(jvm_options=jvm_options)
    try:
        ready_s = time.monotonic() - started
        ready_cpu = group_cpu_seconds(emu.proc.pid)
        workload_s = workload(emu.host, writes)
        time.sleep(idle_tail_s)
        cpu = group_cpu_seconds(emu.proc.pid)
    finally:
        emu.stop()
    return {"jvm_options": jvm_options or "(the JVM's defaults)", "ready_s": round(ready_s, 2),
            "ready_cpu_s": round(ready_cpu, 2), "workload_s": round(workload_s, 2), "cpu_s": round(cpu, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 writes a variant (CI's size)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    writes = 100 if args.quick else 3000
    rows = []
    for options in ("", emulators.JVM_OPTIONS):
        print(f"Firestore emulator, {writes} writes, JAVA_TOOL_OPTIONS={options!r} ...", file=sys.stderr, flush=True)
        rows.append(measure(options, writes, 1 if args.quick else IDLE_TAIL_S))
    base, ours = rows
    result = {"writes": writes, "rows": rows, "cpu_ratio": round(ours["cpu_s"] / base["cpu_s"], 2),
              "workload_ratio": round(ours["workload_s"] / base["workload_s"], 2)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"\n{'JVM options':<45} {'ready s':>8} {'CPU at ready s':>15} {'workload s':>11} {'CPU s':>7}")
    for r in rows:
        print(f"{r['jvm_options']:<45} {r['ready_s']:>8} {r['ready_cpu_s']:>15} {r['workload_s']:>11} {r['cpu_s']:>7}")
    print(f"\nharness options / defaults: CPU {result['cpu_ratio']}, workload time {result['workload_ratio']}")


if __name__ == "__main__":
    main()
