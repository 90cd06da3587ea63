"""The collectives' safety rails, for every multi-rank piece of the library (distributed.TorchJob, torch_sharded,
framework_files): how long a collective may block, waiting on an asynchronous one until a deadline, running one
rank's long work while every rank keeps beating, and letting go of a process group at the end of a run. torch is
imported inside each function, so importing this module costs nothing in a single-process job.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

from respawn import contract

# Why 300 s (docs/checkpoint.md, "Collective timeouts"): with rank 0's restore, downloads and final save under
# run_beating, a collective waits only on the ranks' skew, never on a checkpoint's size; five minutes covers that skew
# with room and is a tenth of gloo's default, so a trainer whose peer vanished (a lost VM sends no FIN) exits 1 in it.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0


def collective_timeout() -> timedelta:
    """How long a collective may block before it raises: $RESPAWN_COLLECTIVE_TIMEOUT_SECONDS, default 300 s. Pass it
    to dist.init_process_group(timeout=...) (the loop's own groups use it already). Every rank must read the same
    value (the node agent sets the environment alike for every member)."""
    raw = os.environ.get(contract.ENV_COLLECTIVE_TIMEOUT, "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_COLLECTIVE_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{contract.ENV_COLLECTIVE_TIMEOUT}={raw!r} is not a positive number of seconds: set it "
                         f"to e.g. {DEFAULT_COLLECTIVE_TIMEOUT_S:.0f}, or unset it for the default")
    return timedelta(seconds=seconds)


def wait(work: Any, deadline: float | None) -> None:
    """Wait for an asynchronous collective until `deadline` (time.monotonic(); None: the group's timeout)."""
    if deadline is None:
        work.wait()
    else:
        work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.001)))


def run_beating(work: Callable[[], Any] | None, group: Any) -> Any:
    """Runs `work` on this rank (None: nothing to do here) on a helper thread while every rank of `group` exchanges,
    every few seconds, whether any rank is still working (one small MAX all-reduce): however long the work takes (a
    download, a full checksum read, an upload), no collective waits longer than a beat plus the ranks' skew, so the
    group's timeout catches a peer that is gone and never a slow disk. Every rank of the group calls it. Returns
    work's result; re-raises its exception on that rank, and raises RuntimeError on the others."""
    import torch
    import torch.distributed as dist

    beat = max(1.0, min(30.0, collective_timeout().total_seconds() / 4))
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised on this rank below, told to the others
            box["error"] = exc

    thread = None
    if work is not None:
        thread = threading.Thread(target=run, name="respawn-beating", daemon=True)
        thread.start()
    flags = torch.zeros(2, dtype=torch.int64)  # [some rank still working, some rank failed]
    while True:
        if thread is not None:
            thread.join(beat)
        flags[0] = int(thread is not None and thread.is_alive())
        flags[1] = int("error" in box)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        if not flags[0]:
            break
    if "error" in box:
        raise box["error"]
    if flags[1]:
        raise RuntimeError("another rank failed in the work this rank waited for (restore, download or final save); "
                           "its log says why")
    return box.get("result")


def release_group(group: Any) -> None:
    """Destroy a process group this library made, at the end of a run. Destroying is not enough: its gloo threads
    run until the group object is freed, so the caller drops its own reference too (the last one goes when this
    returns, and the group's destructor joins its threads). Why: after a collective has completed (wait() has
    returned) its gloo worker thread still lets go of the collective's tensors, and for a tensor that has a Python
    object (even one Python still holds) that takes the GIL (TensorImpl::decref_pyobject). A worker that gets there
    while the interpreter finalizes is ended by Python (pthread_exit) inside runLoop, a noexcept frame: "terminate
    called without an active exception", SIGABRT, a finished run's exit -6 (the aborting thread's stack, seen under
    load: pt_gloo_runloop, ProcessGroupGloo::runLoop, decref_pyobject, PyEval_AcquireThread, pthread_exit,
    _Unwind_ForcedUnwind, std::terminate). The last collectives of a run come just before the exit, so a busy
    machine that runs the worker late makes it likely. A group already destroyed (the whole world was) just goes."""
    import torch.distributed as dist

    if group is not None and dist.is_initialized():
        try:
            dist.destroy_process_group(group)
        except ValueError:  # not registered any more
            pass
