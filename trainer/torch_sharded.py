"""Sharded PyTorch state (FSDP2 / DTensor parameters) in a multi-rank job on one node: every rank writes its own
shards with torch.distributed.checkpoint (DCP), and rank 0 commits the step once every rank's files are durable.

    step_{step:012d}/  __0_0.distcp __1_0.distcp ...  .metadata  manifest.json  COMMITTED

- The `.distcp` files and `.metadata` are DCP's own (FileSystemWriter: each rank writes the items DCP planned for
  it, replicated tensors and non-tensor values once for the job, and fsyncs them; rank 0 writes `.metadata`). A
  checkpoint written by N ranks loads on M ranks: DCP reads, for each rank's DTensor shards, the byte ranges of
  the saved shards they overlap (resharding).
- `manifest.json` and `COMMITTED` are the single-process format's (respawn.ckpt.format), the manifest with
  `layout: "torch-dcp"`, `world_size` and every file of the step with its size and checksum.

The commit is two-phase. (1) Every rank runs dcp.save into the step directory, then sizes and checksums its own
files: its vote. A rank whose save raised, that was cancelled or that is past the deadline votes no. (2) The votes
meet in an all_gather on a gloo group of the checkpoint's own (the save runs on a background thread, beside the
training's collectives and the notice agreement on the main thread); rank 0 commits only if every rank voted yes
and the votes cover every file DCP's metadata names: it fsyncs the directory, writes the manifest and the marker,
then tells the other ranks, uploads and applies retention as for one process. A rank that dies or overruns the
deadline leaves the step without its marker: restore falls back to the previous committed step, never a torn one.

Periodic saves stay asynchronous: the loop blocks for a copy of the state dict into CPU buffers that are reused
from save to save (DCP's own staging helpers); dcp.save, the checksums and the commit run on the background
thread. The emergency save writes the live state (the loop is stopped) on a helper thread joined at the deadline:
DCP's save cannot be stopped half-way, so a rank that overruns abandons it and its vote never comes.
"""

from __future__ import annotations

from copy import deepcopy
import json
import os
import shutil
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import _init_optim_state

from . import _log, checksum, format as fmt, hosts
from .distributed import collective_timeout, run_beating
from .manager import CheckpointManager, SaveOutcome, SaveState, unrestorable

LAYOUT = "torch-dcp"
DCP_METADATA = ".metadata"
# Test hook: "RANK:STEP" makes that rank exit (code 1) in the save of that step, after its DCP write and before its
# vote, as a rank killed mid-save would (tests/test_trainer_sharded.py).
TEST_EXIT_ENV = "RESPAWN_TEST_EXIT_IN_SAVE"
_STATES = list(SaveState)
_DURABLE = [None, "local", "remote"]


class TorchShardedManager(CheckpointManager):
    """A CheckpointManager for sharded torch state, one per rank (every rank calls save, emergency_save and
    restore through TrainingLoop). Rank 0 alone writes the status file, commits, uploads and applies retention;
    the other ranks keep no remote store. The job (respawn.ckpt.distributed.Job) attaches it on entering the loop."""

    def attach(self) -> None:
        """Called once on every rank, in the same order (new_group is collective), before the restore."""
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        # Its own group: the periodic save's collectives run on the background thread, and must never interleave
        # with the agreement's or the training's on the main thread.
        self._group = dist.new_group(backend="gloo", timeout=collective_timeout())
        self._busy = threading.Lock()  # one DCP save on the group at a time
        self._staged: dict | None = None
        groups = hosts.shared_groups(self.local.root, self._rank, lambda data: self._all_gather(data, None))
        # Hosts with their own disks: every rank uploads its files, rank 0 commits in the remote store.
        self._per_host = hosts.per_host(groups, self.remote is not None, "ranks")
        self._host_leader = any(g[0] == self._rank for g in groups)
        if not self._per_host and self._rank != 0:
            self.remote = None  # rank 0 uploads the committed step

    # ---- the snapshot ---------------------------------------------------------------------------------------

    def _flatten(self, state: Any, copy: bool) -> dict:
        """DCP's flat state dict; copy=True: tensors copied into the reused CPU buffers, the rest deep-copied."""
        flat, _ = flatten_state_dict(state)
        if not copy:
            return flat
        tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
        if self._staged is None or self._staged.keys() != tensors.keys():
            self._staged = _create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())
        cuda = torch.cuda.is_available()
        staged = _copy_state_dict(tensors, self._staged, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        return {k: staged[k] if k in staged else deepcopy(v) for k, v in flat.items()}

    def prepare_snapshot(self, state: Any) -> None:
        """Allocate the CPU buffers now (after restore, off the first periodic save's stall)."""
        tensors = {k: v for k, v in flatten_state_dict(state)[0].items() if isinstance(v, torch.Tensor)}
        self._staged = _create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())

    # ---- the two-phase commit -------------------------------------------------------------------------------

    def _write_and_ship(self, step, kind, payload: dict, control, retention) -> SaveOutcome:
        if control.deadline is None:
            with self._busy:
                return self._save_and_commit(step, kind, payload, control, retention)
        # The emergency save: this rank gives up at the deadline, whatever DCP is doing.
        if not self._busy.acquire(timeout=max(control.deadline - time.monotonic(), 0.0)):
            return SaveOutcome(SaveState.ABANDONED, step, reason="a periodic save was still running at the deadline")
        result: list[SaveOutcome] = []

        def run():
            try:
                result.append(self._save_and_commit(step, kind, payload, control, retention))
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

    def _save_and_commit(self, step, kind, flat: dict, control, retention) -> SaveOutcome:
        started = time.monotonic()
        step_dir = self.local.step_dir(step)
        vote: dict[str, Any]
        try:
            if self._per_host and self._rank == 0:
                # A leftover of an earlier attempt at this step (its marker first) goes before any rank uploads:
                # they upload only after dcp.save, whose collectives wait for this rank.
                self.remote.delete_step(step)
            written = dcp.save(flat, storage_writer=dcp.FileSystemWriter(step_dir, sync_files=True),
                               process_group=self._group)
            hook = os.environ.get(TEST_EXIT_ENV, "")
            if hook == f"{self._rank}:{step}":
                os._exit(1)
            control.check(f"writing step {step}")
            named = {info.relative_path for info in written.storage_data.values()} | {DCP_METADATA}
            mine = sorted(n for n in named
                          if n.startswith(f"__{self._rank}_") or (self._rank == 0 and n == DCP_METADATA))
            files = {}
            for name in mine:
                size, digest = checksum.of_file(os.path.join(step_dir, name))
                files[name] = {"size": size, "checksum": digest}
            control.check(f"checksumming step {step}")
            if self._per_host:
                self.remote.put_files(step_dir, step, mine, control)
            vote = {"ok": True, "files": files, "named": sorted(named) if self._rank == 0 else None}
        except fmt.Abandoned as exc:
            vote = {"ok": False, "reason": str(exc)}
        except Exception as exc:  # noqa: BLE001 - this rank votes no; rank 0 then does not commit
            vote = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
            _log.error("sharded checkpoint: this rank's save failed", step=step, rank=self._rank, error=vote["reason"])
        try:
            votes = self._all_gather(json.dumps(vote).encode(), control.deadline)
        except Exception as exc:  # noqa: BLE001 - a peer gone or the deadline: no commit
            _log.error("sharded checkpoint: the votes did not all arrive; not committed", step=step, rank=self._rank,
                       error=f"{type(exc).__name__}: {exc}")
            return SaveOutcome(SaveState.ABANDONED, step, reason=f"commit vote: {type(exc).__name__}: {exc}")
        outcome = manifest = None
        if self._rank == 0:
            outcome, manifest = self._commit(step, kind, [json.loads(v) for v in votes], control, started)
        message = torch.tensor([_STATES.index(outcome.state), _DURABLE.index(outcome.durable)] if outcome
                               else [-1, -1], dtype=torch.int64)
        try:
            self._wait(dist.broadcast(message, src=0, group=self._group, async_op=True), control.deadline)
        except Exception as exc:  # noqa: BLE001 - rank 0's marker alone decides; the others do not know it
            if self._rank != 0:
                return SaveOutcome(SaveState.ABANDONED, step,
                                   reason=f"rank 0's commit not received: {type(exc).__name__}: {exc}")
            _log.warning("could not tell the other ranks the commit's outcome", step=step, error=str(exc))
        if self._per_host and self._rank != 0 and self._host_leader:
            for old in [s for s in self.local.steps() if s <= step]:  # sent or useless: the remote store decides
                self.local.delete_step(old)
        if self._rank != 0:
            state = _STATES[int(message[0])]
            if state is SaveState.COMMITTED:
                self._committed(step, kind, _DURABLE[int(message[1])])  # this node's status file, if it keeps one
                if self._per_host:
                    self._remote_committed.add(step)
            return SaveOutcome(state, step, _DURABLE[int(message[1])], None if state is SaveState.COMMITTED
                               else f"rank 0's commit {state}")
        if not outcome.committed:
            return outcome
        durable, reason = outcome.durable, None
        if self.remote is not None and not self._per_host:
            durable, reason = self._ship(step, kind, manifest, control)
        if retention:
            self.apply_retention(protect={step})
        return SaveOutcome(SaveState.COMMITTED, step, durable, reason, round(time.monotonic() - started, 3),
                           manifest["total_bytes"])

    def _commit(self, step, kind, votes: list[dict], control, started) -> tuple[SaveOutcome, dict | None]:
        """Rank 0: the manifest and the marker, only when every rank's files are durable and accounted for (on
        separate hosts: uploaded, and the commit is written in the remote store). Returns the outcome and the
        manifest (None when not committed)."""
        no = {r: v.get("reason") for r, v in enumerate(votes) if not v["ok"]}
        if no:
            _log.warning("sharded checkpoint not committed: a rank did not finish its part; the previous committed "
                         "checkpoint stays the newest", step=step, ranks=no)
            return SaveOutcome(SaveState.ABANDONED, step, reason=f"ranks {sorted(no)} did not finish: {no}"), None
        files = {name: meta for v in votes for name, meta in v["files"].items()}
        missing = sorted(set(votes[0]["named"]) - set(files))
        step_dir = self.local.step_dir(step)
        try:
            if missing:
                raise RuntimeError(f"no rank reported DCP's files {missing}")
            manifest = {
                "format": fmt.FORMAT, "version": fmt.VERSION, "layout": LAYOUT, "step": step, "kind": kind,
                "framework": "torch", "created_at": time.time(),
                "durable": "remote" if self.remote is None or self._per_host else "local", "world_size": self._world,
                "checksum_algorithm": checksum.DEFAULT_ALGORITHM,
                "total_bytes": sum(f["size"] for f in files.values()), "files": dict(sorted(files.items())),
                "job_id": self.job_id, "attempt": self.attempt,
            }
            if self._per_host:
                control.check(f"committing step {step}")
                self.remote.commit_step(step, manifest, control)
                self._remote_committed.add(step)
                self._kinds[(self.remote.uri, step)] = kind
                self._committed(step, kind, "remote")
                _log.info("checkpoint committed in the remote store", step=step, kind=kind, ranks=self._world,
                          bytes=manifest["total_bytes"], seconds=round(time.monotonic() - started, 3),
                          remote=self.remote.uri)
                return SaveOutcome(SaveState.COMMITTED, step, "remote"), manifest
            for name in os.listdir(step_dir):  # leftovers of an earlier attempt at this step
                if name not in files:
                    path = os.path.join(step_dir, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            fmt.fsync_dir(step_dir)  # every rank's files are fsync'd; their names now too
            data = json.dumps(manifest, indent=1).encode()
            fmt.write_file_durable(os.path.join(step_dir, fmt.MANIFEST), data)
            fmt.fsync_dir(step_dir)
            control.check(f"committing step {step}")
            fmt.write_file_durable(os.path.join(step_dir, fmt.MARKER),
                                   fmt.marker_bytes(step, data, manifest["checksum_algorithm"]))
            fmt.fsync_dir(step_dir)
            fmt.fsync_dir(self.local.root)
        except fmt.Abandoned as exc:
            _log.warning("sharded checkpoint abandoned", step=step, reason=str(exc))
            return SaveOutcome(SaveState.ABANDONED, step, reason=str(exc)), None
        except Exception as exc:  # noqa: BLE001 - reported; the previous committed step stays the newest
            self.last_error = f"{type(exc).__name__}: {exc}"
            _log.error("sharded checkpoint commit failed", step=step, error=self.last_error)
            return SaveOutcome(SaveState.FAILED, step, reason=self.last_error), None
        self._kinds[(self.local.uri, step)] = kind
        self._committed(step, kind, manifest["durable"])
        _log.info("checkpoint committed", step=step, kind=kind, ranks=self._world, bytes=manifest["total_bytes"],
                  seconds=round(time.monotonic() - started, 3), dir=step_dir)
        return SaveOutcome(SaveState.COMMITTED, step, manifest["durable"]), manifest

    def _all_gather(self, data: bytes, deadline: float | None) -> list[bytes]:
        """Every rank's bytes, through two all_gathers (sizes, then padded bytes) bounded by the deadline."""
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self._world)]
        self._wait(dist.all_gather(sizes, size, group=self._group, async_op=True), deadline)
        n = max(int(max(sizes)), 1)  # no empty tensors: frombuffer refuses them
        buf = torch.zeros(n, dtype=torch.uint8)
        if data:
            buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.empty(n, dtype=torch.uint8) for _ in range(self._world)]
        self._wait(dist.all_gather(out, buf, group=self._group, async_op=True), deadline)
        return [bytes(o[:int(s)].numpy()) for o, s in zip(out, sizes)]

    @staticmethod
    def _wait(work, deadline: float | None) -> None:
        if deadline is None:
            work.wait()
        else:
            work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.001)))

    # ---- restore --------------------------------------------------------------------------------------------

    def restore_sharded(self, objects: dict[str, Any], broadcast_step) -> tuple[int, dict] | None:
        """Every rank: (step, state dict loaded into this rank's shards) of the newest committed step rank 0 could
        verify, or None. Rank 0 picks and verifies the step (downloading it from the remote store if it must);
        `broadcast_step(step or -1)` tells the others; then every rank loads it through DCP, which reshards."""
        picked: list = []  # rank 0 may download and read the whole step: the others wait beating (run_beating)
        run_beating((lambda: picked.append(self._newest_verified())) if self._rank == 0 else None, self._group)
        found = picked[0] if picked else None
        step = broadcast_step(found[0] if found else -1)
        if step < 0:
            return None
        if self._per_host:
            self._fetch_on_every_host(step)
        step_dir = self.local.step_dir(step)
        saved = {key.split(".", 1)[0] for key in dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata}
        template = _template(objects, saved)
        dcp.load(template, checkpoint_id=step_dir, process_group=self._group)
        if self._rank == 0:
            manifest = found[1]
            self._step = step
            durable = "remote" if self.remote is None or step in self._remote_committed else "local"
            self.status.update(step=step, committed_step=step, committed_kind=manifest["kind"],
                               committed_durable=durable)
            _log.info("restored sharded checkpoint", step=step, kind=manifest["kind"], saved_by=manifest["world_size"],
                      ranks=self._world, bytes=manifest["total_bytes"])
        return step, template

    def _fetch_on_every_host(self, step: int) -> None:
        """Separate hosts: each host's first rank copies the step rank 0 chose from the remote store onto its own
        disk (rank 0's host has it already) and verifies it; every rank learns whether all hosts have it."""
        error = ""

        def copy() -> None:
            nonlocal error
            try:
                self._local_copy(step, self.remote)
            except Exception as exc:  # noqa: BLE001 - told to every rank below
                error = f"rank {self._rank}: {type(exc).__name__}: {exc}"

        run_beating(copy if self._host_leader and self._rank != 0 else None, self._group)  # downloads take long
        errors = [e.decode() for e in self._all_gather(error.encode(), None) if e]
        if errors:
            raise RuntimeError(f"step {step} could not be copied from {self.remote.uri} onto every host: "
                               f"{'; '.join(errors)}; check that every host can read the checkpoint URI")
        # Every rank knows the same committed steps (so all skip, or all make, a save of one): this one, and those
        # committed from here on.
        self._remote_committed = {step}

    def _local_copy(self, step: int, store) -> dict:
        """The step from `store` verified (every file's checksum) in this host's local directory; its manifest."""
        step_dir = store.get_step(step, self.local.root)
        manifest = fmt.verify(step_dir)
        fmt.check_layout(manifest, step, LAYOUT)
        if step_dir != self.local.step_dir(step):  # a file:// store's own directory: every rank
            self.local.put_step(step_dir, step, manifest)  # reads the node's local copy
        return manifest

    def _newest_verified(self) -> tuple[int, dict] | None:
        """Rank 0: the newest committed step whose every file has its manifest's size and checksum."""
        local, remote = self._committed_steps()
        failed: dict[int, str] = {}
        for step in sorted(local | remote, reverse=True):
            for store in ([self.local] if step in local else []) + ([self.remote] if step in remote else []):
                try:
                    return step, self._local_copy(step, store)
                except fmt.NotRestorable:
                    raise
                except Exception as exc:  # noqa: BLE001 - corrupt, torn or unreadable: the next one
                    failed[step] = f"{type(exc).__name__}: {exc}"
                    _log.warning("checkpoint unusable; falling back to an older one", step=step, store=store.uri,
                                 reason=failed[step])
        if failed:
            raise unrestorable(failed, self.local.uri, self.remote.uri if self.remote else None)
        _log.info("no committed checkpoint found; starting from scratch", local=self.local.uri,
                  remote=self.remote.uri if self.remote else None)
        return None


def _template(objects: dict[str, Any], saved: set[str]) -> dict:
    """The state dict DCP loads into: each object's current state (this rank's shards of the new mesh), for the
    names the checkpoint holds. Optimizer state is created first (Adam's is lazy: an empty state would load
    nothing); top-level dicts are copied, so that the loop's clear() + update() of a dict object keeps them."""
    from .loop import _accessors, _capture_rng

    template: dict[str, Any] = {}
    for name, obj in objects.items():
        if name not in saved:
            continue
        if isinstance(obj, torch.optim.Optimizer):
            _init_optim_state(obj)
        value = _accessors(name, obj)[0]()
        template[name] = dict(value) if isinstance(value, dict) else value
    if "rng" in saved:
        template["rng"] = _capture_rng()
    return template
