"""`python -m sim serve --host 127.0.0.1 --port PORT`: run the simulated Compute Engine and Cloud TPU APIs alone.

The process serves until SIGINT or SIGTERM, then stops every node process group and metadata server it started.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path

LOOPBACK = ("127.0.0.1", "localhost")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description="A local Google Cloud for Compute Engine and Cloud TPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Compute v1 and TPU v2 REST subsets and the /sim/ control API")
    serve.add_argument("--host", default="127.0.0.1", help="must be 127.0.0.1: the sim never listens beyond loopback")
    serve.add_argument("--port", type=int, default=0, help="0 = a free port (printed at start)")
    serve.add_argument("--project", default="respawn-local", help="the demo's and the CLI's emulator project")
    serve.add_argument("--notice-seconds", type=float, default=30.0)
    serve.add_argument("--op-delay", type=float, default=0.2)
    serve.add_argument("--boot-command", default=None, help="what each node runs, e.g. 'python -m respawn.agent'")
    serve.add_argument("--nodes-root", type=Path, default=None, help="node directories (default: a temporary one)")
    serve.add_argument("--audit-topic", default=None,
                       help="publish sink-selected audit entries to this Pub/Sub topic (needs PUBSUB_EMULATOR_HOST)")
    args = parser.parse_args(argv)

    if args.host not in LOOPBACK:
        parser.error(f"--host {args.host}: the sim serves on 127.0.0.1 only (it has no authentication)")

    from sim.server import SimServer

    sink = None
    if args.audit_topic:
        from sim.audit_router import AuditRouter

        sink = AuditRouter(args.project, topic=args.audit_topic)
    sim = SimServer(args.project, notice_seconds=args.notice_seconds, op_delay=args.op_delay,
                    boot_command=shlex.split(args.boot_command) if args.boot_command else None,
                    nodes_root=args.nodes_root, audit_sink=sink, port=args.port)
    # The handlers take no lock: Python runs them in the main thread, also where it holds one (threading.Event's
    # inside its wait()), and a handler asking for it there would block the stop for good.
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    sim.start()
    print(f"sim: serving project {args.project} at {sim.endpoint} (control API at {sim.endpoint}/sim/)", flush=True)
    try:
        while not stop:
            time.sleep(0.1)
    finally:
        sim.stop()
        if sink is not None:
            sink.close()
    print("sim: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
