"""Measure a running agent's footprint: resident memory and CPU use over a window.

    python -m respawn.agent.measure --pid $(systemctl show -p MainPID --value respawn-agent) --seconds 10

Reads /proc/PID/status (VmRSS, VmHWM), /proc/PID/smaps_rollup (Pss: RSS with shared pages divided among
their users) and the utime+stime ticks in /proc/PID/stat at the start and end of the window; threads included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the whole line)


def measure(pid: int, seconds: float = 10.0) -> dict[str, float | int | None]:
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), _cpu_ticks(pid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), _cpu_ticks(pid)
    return {
        "pid": pid,
        "window_s": round(t1 - t0, 2),
        "rss_mb": round((_status_kb(pid, "VmRSS") or 0) / 1024, 1),
        "peak_rss_mb": round((_status_kb(pid, "VmHWM") or 0) / 1024, 1),
        "pss_mb": None if (pss := _pss_kb(pid)) is None else round(pss / 1024, 1),
        "threads": _status_kb(pid, "Threads"),
        "cpu_percent": round(100.0 * (c1 - c0) / hz / (t1 - t0), 3),
        "cpu_seconds": round((c1 - c0) / hz, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m respawn.agent.measure", description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, required=True, help="the agent's pid")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the CPU window (default 10)")
    args = p.parse_args(argv)
    try:
        print(json.dumps(measure(args.pid, args.seconds)))
    except OSError as exc:
        print(f"cannot read /proc/{args.pid}: {exc}; is the agent running and is this Linux?", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
