"""A stand-in guest program for checking the sim's node lifecycle (tests, and `python -m sim serve` smoke runs).

Run as a node's boot command: `python PATH/TO/sim/probe_guest.py [--ignore-sigterm]` (by path: a node's cwd is its
disk, where the checkout's sim package is not importable). In its cwd (the node's disk) it
- appends one line per boot to `boots.log`,
- writes `boot-<n>.json`: its pid, a child's pid (the child runs in a session of its own, as the agent's trainer
  does, to show that a power-off ends every process of the guest), RESPAWN_BOOT_ID, GCE_METADATA_HOST,
  RESPAWN_NODE_DIR, and what the metadata server says for instance/name and instance/attributes/,
- on SIGTERM appends `sigterm preempted=<instance/preempted>` to `events.log`, then exits, or keeps running with
  --ignore-sigterm (so the sim must kill it after the notice window).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def metadata(path: str, params: str = "") -> str:
    req = urllib.request.Request(f"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1/{path}{params}",
                                 headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def main(argv: list[str]) -> int:
    ignore = "--ignore-sigterm" in argv
    here = Path.cwd()
    with open(here / "boots.log", "a") as f:
        f.write(f"{time.time()}\n")
    boot = len((here / "boots.log").read_text().splitlines())
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"], start_new_session=True)

    def on_term(signum, frame):
        with open(here / "events.log", "a") as f:
            f.write(f"sigterm preempted={metadata('instance/preempted')}\n")
        if not ignore:
            child.kill()
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    info = {
        "pid": os.getpid(), "child_pid": child.pid, "cwd": str(here),
        "GCE_METADATA_HOST": os.environ.get("GCE_METADATA_HOST"), "RESPAWN_NODE_DIR": os.environ.get("RESPAWN_NODE_DIR"),
        "RESPAWN_BOOT_ID": os.environ.get("RESPAWN_BOOT_ID"),
        "name": metadata("instance/name"), "attributes": json.loads(metadata("instance/attributes/", "?recursive=true")),
    }
    tmp = here / f"boot-{boot}.json.tmp"
    tmp.write_text(json.dumps(info))
    tmp.rename(here / f"boot-{boot}.json")
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
