"""Checkpoints a training framework writes itself (the Hugging Face Trainer's checkpoint-N/, a Lightning .ckpt, an
Accelerate save_state folder, an Orbax step), committed with Respawn's protocol: every member of the job (a rank, a
JAX process) writes its part into the step directory in the framework's own format, votes with the files it holds,
and member 0 writes the manifest (every file's size and checksum) and COMMITTED only when every vote is yes
(respawn.ckpt.commit). The step directory stays the framework's: its own loader reads it, beside two files of ours.

A save's state is a `Files`: `now` runs on the caller's thread (the framework's own save, collectives included);
`later` runs on the save's background thread (a periodic save's writes from an in-memory snapshot; no collective on
the training's process groups there). Then the members' files are checksummed, voted on and committed, and the step
uploaded to the remote store, off the training thread for a periodic save. An emergency save runs all of it on the
caller's thread, within the notice's deadline. restore() returns the newest committed step that verifies as a
local directory every member can read.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Callable

from . import checksum, format as fmt
from .commit import Seam
from .manager import ShardedManager

LAYOUT = "framework-files"
_OURS = {fmt.MANIFEST, fmt.MARKER}


@dataclass(frozen=True)
class Files:
    """What a save writes into the step directory (its path is the argument): `now` on the caller's thread, then
    `later` on the save's thread. Either may be None."""

    now: Callable[[str], None] | None = None
    later: Callable[[str], None] | None = None


class OneMember:
    """The seam of a job of one process: nothing to exchange."""

    rank, size = 0, 1

    def all_gather(self, key: str, data: bytes, control: fmt.WriteControl | None = None) -> list[bytes]:
        return [data]

    def broadcast(self, key: str, data: bytes | None, control: fmt.WriteControl | None = None) -> bytes:
        return data


def default_seam() -> Seam:
    """The job this process is a member of: torch.distributed's ranks (a gloo group of the checkpoint's own),
    jax.distributed's processes (the coordination service's key-value store), or this process alone."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from .torch_sharded import GroupSeam

        return GroupSeam()
    jax = sys.modules.get("jax")
    if jax is not None and jax.process_count() > 1:
        from .jax_distributed import KeyValueSeam

        return KeyValueSeam()
    return OneMember()


def step_files(step_dir: str) -> dict[str, dict]:
    """{relative path: {size, checksum}} of every file under a step directory but the manifest and marker."""
    files = {}
    for here, dirs, names in os.walk(step_dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(here, name)
            rel = os.path.relpath(path, step_dir).replace(os.sep, "/")
            if rel not in _OURS:
                size, digest = checksum.of_file(path)
                files[rel] = {"size": size, "checksum": digest}
    return files


class FilesManager(ShardedManager):
    """A CheckpointManager whose steps a framework writes (one per member: every member calls save,
    emergency_save and restore, in the same order). framework: the manifest's framework ("transformers",
    "lightning", ...): a step written by another is not restored. seam: the members' exchanges (default_seam()).
    The notice, the deadline, the status file and retention work as for every manager."""

    layout, members = LAYOUT, "members"

    def __init__(self, *args: Any, framework: str, seam: Seam | None = None, **kwargs: Any) -> None:
        self.framework = framework
        seam = seam or default_seam()
        super().__init__(*args, seam=seam, **kwargs)
        self._group = getattr(seam, "group", None)  # a torch group: long work alone keeps its heartbeat
        self._step_in_hand = 0  # the step save/emergency_save is writing (_flatten runs the framework's `now`)

    def _alone(self, work: Callable[[], Any]) -> Any:
        if self._group is None:
            return super()._alone(work)
        from .distributed import run_beating

        return run_beating(work if self._rank == 0 else None, self._group)

    def prepare_snapshot(self, state: Any) -> None:
        """Nothing to pre-allocate: the framework's writers hold their own buffers."""

    # ---- the save: `now` here, the rest on the save's thread --------------------------------------------------

    def _flatten(self, state: Any, copy: bool) -> Files:
        if not isinstance(state, Files):
            raise TypeError(f"{type(self).__name__} saves a respawn.ckpt.framework_files.Files (what the framework "
                            f"writes into the step directory), not {type(state).__name__}")
        self._find_hosts()
        step = self._step_in_hand
        step_dir = self.local.step_dir(step)
        # An uncommitted leftover of an earlier attempt at this step goes before any member writes into it.
        if self._host_leader or self._rank == 0:
            shutil.rmtree(step_dir, ignore_errors=True)
            os.makedirs(step_dir, exist_ok=True)
        self._seam.all_gather(f"respawn/files/{step}/clean", b"")
        if state.now is not None:
            state.now(step_dir)
        return state

    def save(self, step: int, state: Any, *, blocking: bool = False, kind: str = "periodic"):
        self._step_in_hand = step
        return super().save(step, state, blocking=blocking, kind=kind)

    def emergency_save(self, step: int, state: Any):
        self._step_in_hand = step
        return super().emergency_save(step, state)

    def _write_files(self, step: int, files: Files, control: fmt.WriteControl) -> dict:
        step_dir = self.local.step_dir(step)
        if self._per_host and self._rank == 0:
            self.remote.delete_step(step)  # a leftover of an earlier attempt, before any member uploads
        if files.later is not None:
            files.later(step_dir)
        control.check(f"writing step {step}")
        # Every member's files are in place before the first host's leader lists them.
        self._seam.all_gather(f"respawn/files/{step}/written", b"", control)
        mine = step_files(step_dir) if self._host_leader or (self._rank == 0 and not self._per_host) else {}
        control.check(f"checksumming step {step}")
        return {"files": mine}

    def _manifest_extra(self, votes: list[dict]) -> dict:
        seen: dict[str, dict] = {}
        for rank, vote in enumerate(votes):
            for name, meta in vote["files"].items():
                if seen.setdefault(name, meta) != meta:
                    raise RuntimeError(f"two hosts wrote {name} differently (member {rank}): a framework file must "
                                       "be written once per job, or alike on every host")
        if not seen:
            raise RuntimeError("the framework wrote no file into the step directory")
        return {"members": len(votes)}

    # ---- restore ------------------------------------------------------------------------------------------------

    def _open_for_restore(self, store, step: int) -> str:
        """Member 0: the step verified (every file's checksum) in this host's local directory."""
        step_dir = store.get_step(step, self.local.root)
        manifest = fmt.verify(step_dir)
        fmt.check_layout(manifest, step, LAYOUT)
        if manifest["framework"] != self.framework:
            raise fmt.CorruptCheckpoint(f"step {step} was written by {manifest['framework']}, not {self.framework}")
        if step_dir != self.local.step_dir(step):  # a file:// store's own directory: every member reads the
            self.local.put_step(step_dir, step, manifest)  # node's local copy
        return self.local.step_dir(step)

    def _load_part(self, step: int, step_dir: str, like: Any) -> tuple[dict, str]:
        """The step's local directory on this host (a host's leader copies it from the remote store first)."""
        if self._per_host:
            copy = (lambda: self._open_for_restore(self.remote, step)) if self._host_leader and self._rank != 0 else None
            if self._group is not None:
                from .distributed import run_beating

                run_beating(copy, self._group)
            elif copy is not None:
                copy()
            self._seam.all_gather(f"respawn/files/{step}/copied", b"")
        step_dir = self.local.step_dir(step)
        return fmt.read_manifest(step_dir), step_dir
