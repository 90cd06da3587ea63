"""`python tests/exit_threads.py SCRIPT [ARGS...]`: runs a trainer script as its __main__ and, as the interpreter
starts to exit (the last atexit hook), prints one JSON line: this rank, the gloo worker threads (pt_gloo_runloop)
still alive and how many one gloo group runs. A process group still alive at exit keeps its worker threads into the
interpreter's finalization, where one that lets go of a collective's tensor aborts the process
(respawn.ckpt.collectives.release_group): a finished run must leave none but the default group's, which the
trainer owns (the integrations leave it alone). For the exit tests of tests/test_integration_*.py."""

from __future__ import annotations

import atexit
import json
import os
import re
import runpy
import sys


def gloo_threads() -> int:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended while listed
            pass
    return sum(name.startswith("pt_gloo") for name in names)


def reports(text: str) -> list[dict]:
    """Each rank's report in a run's output: found anywhere, not line by line (two ranks' unbuffered writes may share
    one line)."""
    return [json.loads(m)["exit_threads"] for m in re.findall(r'\{"exit_threads": \{[^{}]*\}\}', text)]


def under(cmd: list[str], script: str) -> list[str]:
    """`cmd` (a launcher's command line) with its trainer `script` run under this file."""
    at = cmd.index(str(script))
    return [*cmd[:at], os.path.abspath(__file__), *cmd[at:]]


def assert_only_the_default_group(text: str, ranks: int = 2) -> None:
    """Every rank reported, and its gloo threads at exit were one group's: the default group, which the trainer keeps;
    none of Respawn's (the agreement's, the commit's)."""
    threads = reports(text)
    assert len(threads) == ranks and all(t["at_exit"] == t["per_group"] for t in threads), threads


def report() -> None:
    import torch.distributed as dist

    print(json.dumps({"exit_threads": {"rank": int(os.environ.get("RANK", "0")), "at_exit": gloo_threads(),
                                       "per_group": dist.ProcessGroupGloo._Options()._threads}}), flush=True)


if __name__ == "__main__":
    atexit.register(report)  # registered before the script runs: atexit runs it last
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
