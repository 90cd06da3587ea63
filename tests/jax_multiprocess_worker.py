"""One process of a 2-process JAX job (jax.distributed on 127.0.0.1, CPU) driving ShardedCheckpointManager
directly, for tests/test_trainer_jax_distributed.py:

    python tests/jax_multiprocess_worker.py save PROCESS_ID COORDINATOR DIR   # commits step 10, then process 1
                                                                             # dies in step 20's save
    python tests/jax_multiprocess_worker.py restore PROCESS_ID COORDINATOR DIR
    python tests/jax_multiprocess_worker.py unshared PROCESS_ID COORDINATOR DIR  # each process its own directory
    python tests/jax_multiprocess_worker.py hosts-save PROCESS_ID COORDINATOR DIR     # the same, with a remote
    python tests/jax_multiprocess_worker.py hosts-restore PROCESS_ID COORDINATOR DIR  # store DIR/remote

Prints `result <JSON>` per outcome. The state: a (4, 8) float32 array sharded by rows over the processes, a
replicated vector and typed key, and per-process host values and a process-local typed key.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from respawn.ckpt import commit, jax_distributed  # noqa: E402


def state(pid: int, scale: float) -> dict:
    mesh = Mesh(np.array(jax.devices()), ("p",))
    rows = np.arange(32, dtype=np.float32).reshape(4, 8) * scale
    return {
        "rows": jax.make_array_from_callback(rows.shape, NamedSharding(mesh, P("p")), lambda i: rows[i]),
        "vec": jax.make_array_from_callback((3,), NamedSharding(mesh, P()), lambda i: np.full(3, scale, np.float32)[i]),
        "key": jax.jit(lambda: jax.random.key(7), out_shardings=NamedSharding(mesh, P()))(),
        "host": {"process": pid, "scale": scale, "local": np.full(2, pid * scale, np.float32)},
        "local_key": jax.random.key(pid),  # process-local (one device): host state of this process
    }


class DiesMidSave(jax_distributed.KeyValueSeam):
    """The fault, through the manager's seam (its commit's exchanges): process 1 is killed in the middle of step
    `step`'s save, its part file torn, before its vote; no report reaches process 0."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step
        self.step_dir = ""  # the manager's directory of the step (set once the manager exists)

    def all_gather(self, key, data, control=None):
        if self.rank == 1 and key == commit.votes_key(self.step):
            with open(os.path.join(self.step_dir, "p00001.bin"), "r+b") as f:
                f.truncate(10)  # torn: half written
            os._exit(9)
        return super().all_gather(key, data, control)


def main(mode: str, pid: int, coordinator: str, root: str) -> None:
    jax.distributed.initialize(coordinator, 2, pid)
    remote = f"file://{root}/remote" if mode.startswith("hosts") else None
    if mode in ("unshared", "hosts-save", "hosts-restore"):  # hosts with disks of their own
        root = os.path.join(root, f"process-{pid}")
    seam = DiesMidSave(20) if mode == "save" else None
    mgr = jax_distributed.ShardedCheckpointManager(remote, local_dir=root, notice_budget_s=5, seam=seam)
    if seam is not None:
        seam.step_dir = mgr.local.step_dir(20)
    if mode in ("unshared", "hosts-save"):
        outcome = mgr.save(10, state(pid, 1.0), blocking=True)
        print("result", json.dumps({"step": 10, "state": outcome.state.value, "reason": outcome.reason}), flush=True)
        return
    if mode == "save":
        ten = mgr.save(10, state(pid, 1.0), blocking=True)
        print("result", json.dumps({"step": 10, "state": ten.state.value}), flush=True)
        mgr.request_preemption("test")
        twenty = mgr.emergency_save(20, state(pid, 2.0))
        print("result", json.dumps({"step": 20, "state": twenty.state.value, "reason": twenty.reason}), flush=True)
        os._exit(0)  # process 1 is gone: skip jax.distributed's shutdown barrier
    step, restored = mgr.restore()
    rows = multihost_utils.process_allgather(restored["rows"], tiled=True)
    print("result", json.dumps({"restored": step, "rows_ok": bool(np.array_equal(rows, np.arange(32).reshape(4, 8))),
                      "vec": np.asarray(restored["vec"].addressable_data(0)).tolist(),
                      "key_ok": bool(np.array_equal(jax.random.key_data(restored["key"]).addressable_data(0),
                                                    jax.random.key_data(jax.random.key(7)))),
                      "local_key_ok": bool(np.array_equal(jax.random.key_data(restored["local_key"]),
                                                          jax.random.key_data(jax.random.key(pid)))),
                      "host": {**restored["host"], "local": restored["host"]["local"].tolist()}}), flush=True)
    if mode == "hosts-restore":  # a save of the step just restored must write nothing (never rewrite a commit)
        sentinel = os.path.join(remote[len("file://"):], "step_000000000010", f"untouched-{pid}")
        open(sentinel, "w").close()  # a rewrite of the step removes its directory first
        again = mgr.save(10, state(pid, 1.0), blocking=True)
        print("result", json.dumps({"again": again.state.value, "rewritten": not os.path.exists(sentinel)}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
