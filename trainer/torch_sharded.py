"""Sharded PyTorch state (FSDP2 / DTensor parameters) in a multi-rank job: every rank writes its own shards with
torch.distributed.checkpoint (DCP) into the step directory, and rank 0 commits the step with the single-process
manifest (`layout: "torch-dcp"`) and marker (respawn.ckpt.commit, over GroupSeam). Layout, snapshot, emergency save
and restore: docs/checkpoint.md ("Sharded state (FSDP2, DTensor) on DCP").

Not a FileSystemWriter whose finish() commits (DCP's coordinator hook): DCP's gather of the write results waits for
the group's timeout, not the notice's deadline, and the results carry no checksums (unless classes of ours are
pickled into `.metadata`); the vote round is one small all_gather beside the file writes. DCP's save cannot be
stopped half-way: the emergency save runs it on a helper thread joined at the deadline, and a rank that overruns
abandons it (its vote never comes).
"""

from __future__ import annotations

from copy import deepcopy
import os
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from . import _log, checksum, format as fmt
from .commit import Seam
from .collectives import collective_timeout, release_group, run_beating, wait
from .manager import SaveOutcome, SaveState, ShardedManager
from .objects import accessors, capture_rng
from .torch_compat import copy_state_dict, create_cpu_state_dict, flatten_state_dict, init_optim_state

LAYOUT = "torch-dcp"
DCP_METADATA = ".metadata"


class GroupSeam:
    """The commit's seam on a gloo group of the checkpoint's own: the periodic save exchanges on the background
    thread, never interleaved with the notice agreement's or the training's collectives on the main thread.
    Building it is collective (new_group): every rank builds its manager at the same point."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo", timeout=collective_timeout())
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def all_gather(self, key: str, data: bytes, control: fmt.WriteControl | None = None) -> list[bytes]:
        """Two all_gathers (sizes, then padded bytes), each bounded by the control's deadline."""
        deadline = control.deadline if control else None
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        wait(dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=self.group, async_op=True),
              deadline)
        n = max(int(max(sizes)), 1)  # no empty tensors: frombuffer refuses them
        buf = torch.zeros(n, dtype=torch.uint8)
        if data:
            buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
        wait(dist.all_gather(out, buf, group=self.group, async_op=True), deadline)
        return [bytes(o[:int(s)].numpy()) for o, s in zip(out, sizes)]

    def broadcast(self, key: str, data: bytes | None, control: fmt.WriteControl | None = None) -> bytes:
        return self.all_gather(key, data if self.rank == 0 else b"", control)[0]


class TorchShardedManager(ShardedManager):
    """A CheckpointManager for sharded torch state, one per rank (every rank calls save, emergency_save and
    restore through TrainingLoop), built on every rank at the same point (its group's new_group is collective).
    Rank 0 alone writes the status file, commits, uploads and applies retention. seam: the commit's exchanges
    (default: a GroupSeam; a test wraps one to inject a fault)."""

    layout, framework, members = LAYOUT, "torch", "ranks"

    def __init__(self, *args: Any, seam: Seam | None = None, **kwargs: Any) -> None:
        super().__init__(*args, seam=seam or GroupSeam(), **kwargs)
        self._group = self._seam.group
        self._busy = threading.Lock()  # one DCP save on the group at a time
        self._staged: dict | None = None

    def _alone(self, work: Callable[[], Any]) -> Any:
        return run_beating(work if self._rank == 0 else None, self._group)  # rank 0 may download and read for long

    def finish(self, step: int) -> None:
        """As CheckpointManager.finish, then the checkpoint's group destroyed and let go (release_group): nothing of
        it outlives the run. The manager saves no more after it."""
        super().finish(step)
        group, self._group = self._group, None
        if isinstance(self._seam, GroupSeam):
            self._seam.group = None
        release_group(group)

    # ---- the snapshot ---------------------------------------------------------------------------------------

    def _flatten(self, state: Any, copy: bool) -> dict:
        """DCP's flat state dict; copy=True: tensors copied into the reused CPU buffers, the rest deep-copied."""
        flat, _ = flatten_state_dict(state)
        if not copy:
            return flat
        tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
        if self._staged is None or self._staged.keys() != tensors.keys():
            self._staged = create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())
        cuda = torch.cuda.is_available()
        staged = copy_state_dict(tensors, self._staged, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        return {k: staged[k] if k in staged else deepcopy(v) for k, v in flat.items()}

    def prepare_snapshot(self, state: Any) -> None:
        """Allocate the CPU buffers now (after restore, off the first periodic save's stall)."""
        tensors = {k: v for k, v in flatten_state_dict(state)[0].items() if isinstance(v, torch.Tensor)}
        self._staged = create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())

    # ---- the save -------------------------------------------------------------------------------------------

    def _write_and_ship(self, step, kind, payload: dict, control, retention) -> SaveOutcome:
        commit = super()._write_and_ship
        if control.deadline is None:
            with self._busy:
                return commit(step, kind, payload, control, retention)
        # The emergency save: this rank gives up at the deadline, whatever DCP is doing.
        if not self._busy.acquire(timeout=max(control.deadline - time.monotonic(), 0.0)):
            return SaveOutcome(SaveState.ABANDONED, step, reason="a periodic save was still running at the deadline")
        result: list[SaveOutcome] = []

        def run():
            try:
                result.append(commit(step, kind, payload, control, retention))
            finally:
                self._busy.release()

        thread = threading.Thread(target=run, name=f"respawn-dcp-{step}", daemon=True)
        thread.start()
        # A little past the deadline: the commit itself checks the deadline, so rank 0 decides, not this join.
        thread.join(max(control.deadline - time.monotonic(), 0.0) + 1.0)
        if result:
            return result[0]
        _log.error("sharded checkpoint abandoned at the deadline on this rank", step=step, rank=self._rank)
        return SaveOutcome(SaveState.ABANDONED, step, reason="deadline reached while writing the shards")

    def _write_files(self, step: int, flat: dict, control: fmt.WriteControl) -> dict:
        step_dir = self.local.step_dir(step)
        if self._per_host and self._rank == 0:
            # A leftover of an earlier attempt at this step (its marker first) goes before any rank uploads: they
            # upload only after dcp.save, whose collectives wait for this rank.
            self.remote.delete_step(step)
        written = dcp.save(flat, storage_writer=dcp.FileSystemWriter(step_dir, sync_files=True),
                           process_group=self._group)
        control.check(f"writing step {step}")
        named = {info.relative_path for info in written.storage_data.values()} | {DCP_METADATA}
        mine = sorted(n for n in named if n.startswith(f"__{self._rank}_") or (self._rank == 0 and n == DCP_METADATA))
        files = {}
        for name in mine:
            size, digest = checksum.of_file(os.path.join(step_dir, name))
            files[name] = {"size": size, "checksum": digest}
        control.check(f"checksumming step {step}")
        return {"files": files, "named": sorted(named) if self._rank == 0 else None}

    def _manifest_extra(self, votes: list[dict]) -> dict:
        missing = sorted(set(votes[0]["named"]) - {name for v in votes for name in v["files"]})
        if missing:
            raise RuntimeError(f"no rank reported DCP's files {missing}")
        return {"world_size": len(votes)}

    # ---- restore --------------------------------------------------------------------------------------------

    def _open_for_restore(self, store, step: int) -> str:
        """Rank 0: the step from `store` verified (every file's checksum) in this host's local directory."""
        step_dir = store.get_step(step, self.local.root)
        manifest = fmt.verify(step_dir)
        fmt.check_layout(manifest, step, LAYOUT)
        if step_dir != self.local.step_dir(step):  # a file:// store's own directory: every rank
            self.local.put_step(step_dir, step, manifest)  # reads the node's local copy
        return self.local.step_dir(step)

    def _load_part(self, step: int, step_dir: str, like: Any) -> tuple[dict, dict]:
        """Every rank loads its shards of the step through DCP, which reshards; on hosts with disks of their own
        each host's first rank first copies the step from the remote store (rank 0's host has it)."""
        if like is None:
            raise TypeError("TorchShardedManager.restore needs like=: the objects whose shards DCP loads into")
        if self._per_host:
            copy = (lambda: self._open_for_restore(self.remote, step)) if self._host_leader and self._rank != 0 else None
            run_beating(copy, self._group)
        step_dir = self.local.step_dir(step)
        saved = {key.split(".", 1)[0] for key in dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata}
        template = _template(like, saved)
        dcp.load(template, checkpoint_id=step_dir, process_group=self._group)
        return fmt.read_manifest(step_dir), template


def _template(objects: dict[str, Any], saved: set[str]) -> dict:
    """The state dict DCP loads into: each object's current state (this rank's shards of the new mesh), for the
    names the checkpoint holds. Optimizer state is created first (Adam's is lazy: an empty state would load
    nothing); top-level dicts are copied, so that the loop's clear() + update() of a dict object keeps them."""
    template: dict[str, Any] = {}
    for name, obj in objects.items():
        if name not in saved:
            continue
        if isinstance(obj, torch.optim.Optimizer):
            init_optim_state(obj)
        value = accessors(name, obj)[0]()
        template[name] = dict(value) if isinstance(value, dict) else value
    if "rng" in saved:
        template["rng"] = capture_rng()
    return template
