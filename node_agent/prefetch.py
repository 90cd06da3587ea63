"""The newest committed checkpoint copied to this node's disk while setup runs, so that the trainer's restore reads
it at the disk's speed instead of waiting on Cloud Storage after the interpreter has started (issue #25, item 3).

The work is respawn.ckpt.manager.prefetch's, in a child process (`INTERP -m respawn.ckpt prefetch LOCAL URI`) with
the trainer's interpreter and environment, started once the library is installed; the agent waits for it before the
trainer starts, so that no two processes write the local checkpoint directory at once. It is skipped where it cannot
help (a file:// store is a disk already). A prefetch that fails or is stopped leaves no committed local copy: the
trainer then reads the store, as before.
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable, Sequence

from respawn.contract import StoreUri
from respawn.logs import log

from .prepare import stop_group


class Prefetch:
    def __init__(self, local_dir: str, checkpoint_uri: str, *, python: str, env: dict[str, str],
                 prefix: Sequence[str] = ()):
        """`prefix`: the container command line that runs `python` in the job's image (image_run.py), if any."""
        self.local_dir, self.uri = local_dir, checkpoint_uri
        self.started = time.monotonic()
        self.child: subprocess.Popen | None = None
        if StoreUri.parse(checkpoint_uri).scheme != StoreUri.GS:
            return
        try:
            self.child = subprocess.Popen([*prefix, python, "-m", "respawn.ckpt", "prefetch", local_dir, checkpoint_uri],
                                          stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            log("WARNING", "checkpoint prefetch could not start; the trainer reads the store", interpreter=python,
                error=str(exc))
            return
        log("INFO", "prefetching the newest committed checkpoint to this disk while setup runs",
            checkpoint_uri=checkpoint_uri, local_dir=local_dir)

    def wait(self, timeout: float, interrupted: Callable[[], bool]) -> None:
        """Until the child ends; stopped at `timeout` s from its start, or when `interrupted()` (a notice)."""
        child = self.child
        if child is None:
            return
        while child.poll() is None:
            if interrupted() or time.monotonic() - self.started > timeout:
                log("WARNING", "checkpoint prefetch stopped; the trainer reads the store",
                    reason="notice" if interrupted() else f"took longer than {timeout:.0f} s")
                self.stop()
                return
            time.sleep(0.05)
        if child.returncode != 0:
            log("WARNING", "checkpoint prefetch failed; the trainer reads the store", exit_code=child.returncode)
            return
        log("INFO", "prepare stage", stage="checkpoint_prefetch", seconds=round(time.monotonic() - self.started, 3))

    def stop(self) -> None:
        if self.child is not None and self.child.poll() is None:
            stop_group(self.child)
