"""`respawn demo --keep`, started for a test: the demo runs its job to the end, prints its summary and the `export`
lines that point `respawn jobs …` at its stand-ins, and keeps them up until it is sent SIGINT (Ctrl-C)."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path


def start(folder: Path, token: str, *args: str) -> tuple[subprocess.Popen, dict, dict[str, str]]:
    """(the demo's process, its summary, the variables of its export lines): `respawn demo ARGS --keep --json
    --no-live --out FOLDER/out`, its stderr in FOLDER/stderr, every process it starts marked RESPAWN_DEMO_TEST=token.
    The caller stops it (SIGINT); a start that fails stops it here."""
    with open(folder / "stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "respawn", "demo", *args, "--keep", "--json", "--no-live",
                                 "--out", str(folder / "out")], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env={**os.environ, "RESPAWN_DEMO_TEST": token})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 600)  # the summary, once the job has ended
        line = proc.stdout.readline() if ready else ""
        said = (folder / "stderr").read_text()
        assert line.strip(), f"no summary; stderr:\n{said[-4000:]}"
        exports = dict(shlex.split(x.removeprefix("export "))[0].split("=", 1)
                       for x in said.splitlines() if x.startswith("export "))
        return proc, json.loads(line), exports
    except BaseException:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        raise
