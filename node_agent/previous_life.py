"""A previous life's checkpoints: after a restart in place, committed checkpoints that exist only on this node's
disk (an emergency save that had no time to reach the checkpoint store) are uploaded before the trainer resumes.

The work is respawn.ckpt.upload_pending's; it runs in a child process (`INTERP -m respawn.ckpt upload-pending LOCAL
URI`) with the trainer's interpreter and environment — the library and NumPy are installed there, not beside the
agent — so that the checkpoint library, the storage client and NumPy never enter the long-running agent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Callable, Sequence

from respawn.logs import log


def has_local_checkpoints(local_dir: str) -> bool:
    try:
        return any(name.startswith("step_") for name in os.listdir(local_dir))
    except OSError:
        return False


def upload_previous_life(local_dir: str, checkpoint_uri: str, *, timeout: float, interrupted: Callable[[], bool],
                         python: str = sys.executable, env: dict[str, str] | None = None,
                         prefix: Sequence[str] = ()) -> bool:
    """Run the upload in a child; stop early (the checkpoints stay on disk for the next life) if `interrupted()`
    turns true, e.g. on a notice. True when the upload finished successfully or there was nothing to upload.
    `prefix`: the container command line that runs `python` in the job's image (image_run.py), if any."""
    if not has_local_checkpoints(local_dir):
        return True
    log("INFO", "uploading checkpoints left on this disk by a previous life", local_dir=local_dir,
        checkpoint_uri=checkpoint_uri, interpreter=python)
    started = time.monotonic()
    try:
        child = subprocess.Popen([*prefix, python, "-m", "respawn.ckpt", "upload-pending", local_dir, checkpoint_uri],
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)  # its own process group
    except OSError as exc:
        log("ERROR", "previous-life upload could not start; the trainer resumes from the newest checkpoint in the "
            "store", interpreter=python, error=str(exc))
        return False
    deadline = time.monotonic() + timeout
    while child.poll() is None:
        if interrupted() or time.monotonic() > deadline:
            log("WARNING", "previous-life upload stopped early; the checkpoints stay on the local disk",
                reason="notice" if interrupted() else f"took longer than {timeout:.0f} s")
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            return False
        time.sleep(0.1)
    if child.returncode != 0:
        log("ERROR", "previous-life upload failed; the trainer resumes from the newest checkpoint in the store",
            exit_code=child.returncode, local_dir=local_dir, checkpoint_uri=checkpoint_uri, interpreter=python,
            hint="the trainer's interpreter needs the respawn library (respawn-library attribute, or installed "
                 "in its environment)")
        return False
    log("INFO", "prepare stage", stage="previous_life_upload", seconds=round(time.monotonic() - started, 3))
    return True
