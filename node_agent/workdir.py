"""The user's code on the node: a content-addressed archive (…/sha256-HEX.tar.gz, packed by respawn.app.workdir) is
downloaded, checked against the digest its name promises, and unpacked into `<node_dir>/workdirs/sha256-HEX/`.

Unpacked once per content: a directory of that name exists only complete (unpacked into a temporary directory,
flushed, then renamed), so a restart in place reuses it without downloading anything.

Unpacking is checked member by member before anything is written (Python 3.9's tarfile has no extraction
`filter=`): only regular files, directories and relative symlinks that stay inside the tree; no absolute names, no
`..`, no member below a symlink, no duplicates, no hard links, devices or FIFOs. Owners, set-uid bits and the
like are not taken from the archive (the agent runs as root): files get 0644, or 0755 when executable.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import tarfile
import time
import zlib
from typing import Callable

from respawn import contract
from respawn.logs import log

from .storage import Fetcher, FetchError

REREGISTER = "re-register the job with --workdir (respawn packs and uploads the archive again)"


class WorkdirError(Exception):
    """The workdir could not be provided; the message names the archive and what to do."""


class UnsafeArchive(Exception):
    """A member that could write or point outside the workdir, or is not a file, directory or symlink."""

    def __init__(self, member: str, problem: str):
        self.member = member
        super().__init__(f"member {member!r} {problem}")


def workdir_path(node_dir: str, digest: str) -> str:
    return os.path.join(node_dir, contract.WORKDIRS_DIR, f"sha256-{digest}")


def _relative_name(name: str) -> str:
    """The member's name as a clean relative path ("" for the archive's root entry); UnsafeArchive otherwise."""
    if name.startswith("/"):
        raise UnsafeArchive(name, "has an absolute name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(name, "climbs out of the workdir with '..'")
    if any("\0" in p for p in parts):
        raise UnsafeArchive(name, "has a NUL byte in its name")
    return "/".join(parts)


def check_members(members: list[tarfile.TarInfo], *,
                  links_out: bool = False) -> list[tuple[str, tarfile.TarInfo]]:
    """(relative name, member) for each member to write, in archive order; UnsafeArchive for the first bad one.
    `links_out`: symlinks may point anywhere (a venv's bin/python names its base interpreter by absolute path);
    nothing is ever written through one either way."""
    plan: list[tuple[str, tarfile.TarInfo]] = []
    seen: dict[str, str] = {}  # relative name → "dir" | "file" | "symlink"
    for m in members:
        rel = _relative_name(m.name)
        if m.isdir():
            kind = "dir"
        elif m.isreg():
            kind = "file"
        elif m.issym():
            kind = "symlink"
            target = m.linkname
            if not target or (target.startswith("/") and not links_out):
                raise UnsafeArchive(m.name, f"is a symlink to {target!r}: only relative symlinks are allowed")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
            if not links_out and (resolved == ".." or resolved.startswith("../")):
                raise UnsafeArchive(m.name, f"is a symlink to {target!r}, which points outside the workdir")
        elif m.islnk():
            raise UnsafeArchive(m.name, "is a hard link; only regular files, directories and symlinks are allowed")
        elif m.ischr() or m.isblk():
            raise UnsafeArchive(m.name, "is a device file; only regular files, directories and symlinks are allowed")
        elif m.isfifo():
            raise UnsafeArchive(m.name, "is a FIFO; only regular files, directories and symlinks are allowed")
        else:
            raise UnsafeArchive(m.name, "is not a regular file, directory or symlink")
        if not rel:
            if kind != "dir":
                raise UnsafeArchive(m.name, "replaces the workdir itself")
            continue  # the archive's "./" entry
        if rel in seen and not (kind == "dir" and seen[rel] == "dir"):
            raise UnsafeArchive(m.name, "appears twice in the archive")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if seen.get(parent) == "symlink":
                raise UnsafeArchive(m.name, f"lies below the symlink {parent!r} (it could be written through it)")
            if seen.get(parent) == "file":
                raise UnsafeArchive(m.name, f"lies below the regular file {parent!r}")
        seen[rel] = kind
        plan.append((rel, m))
    # A member that came before a symlink of the same prefix: check again now that every symlink is known.
    for rel, _ in plan:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if seen.get(parent) == "symlink":
                raise UnsafeArchive(rel, f"lies below the symlink {parent!r} (it could be written through it)")
    return plan


def unpack(archive: str, dest: str) -> tuple[int, int]:
    """Unpack `archive` (gzip'd tar) into the new directory `dest`, checking every member first. Returns (files,
    bytes). Raises UnsafeArchive, or tarfile.TarError/EOFError/zlib.error/OSError for a corrupt archive."""
    files = size = 0
    with tarfile.open(archive, "r:gz") as tar:
        plan = check_members(tar.getmembers())
        os.makedirs(dest)
        for rel, m in plan:
            path = os.path.join(dest, *rel.split("/"))
            if m.isdir():
                os.makedirs(path, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if m.issym():
                os.symlink(m.linkname, path)
                continue
            src = tar.extractfile(m)
            assert src is not None
            with src, open(path, "xb") as out:  # x: never write through something already there
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(path, 0o755 if m.mode & 0o100 else 0o644)
            os.utime(path, (m.mtime, m.mtime))
            files += 1
            size += m.size
    # Lexically inside is not always physically inside (a symlink to "." followed by one to "that/.."): ask the
    # file system, now that every link exists.
    root = os.path.realpath(dest)
    for rel, m in plan:
        if m.issym():
            real = os.path.realpath(os.path.join(dest, *rel.split("/")))
            if real != root and not real.startswith(root + os.sep):
                raise UnsafeArchive(m.name, f"is a symlink to {m.linkname!r}, which points outside the workdir")
    return files, size


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def ensure_workdir(uri: str, node_dir: str, fetcher: Fetcher, *,
                   interrupted: Callable[[], bool] = lambda: False) -> tuple[str, bool]:
    """The unpacked workdir for `uri`: (path, fresh). Reused without downloading when it is already on this disk
    (fresh False). Raises WorkdirError naming the archive and what to do, storage.Interrupted on a notice."""
    digest = contract.workdir_digest(uri)
    final = workdir_path(node_dir, digest)
    if os.path.isdir(final):
        log("INFO", "prepare stage", stage="workdir_reuse", uri=uri, path=final, seconds=0.0, bytes=0)
        return final, False
    root = os.path.dirname(final)
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # what an agent killed mid-way left behind
        if name.startswith(".partial-"):
            _remove(os.path.join(root, name))
    archive = os.path.join(root, f".partial-{digest}-{os.getpid()}.tar.gz")
    staging = os.path.join(root, f".partial-{digest}-{os.getpid()}")
    try:
        started = time.monotonic()
        try:
            size, actual = fetcher.fetch(uri, archive, missing_hint=f"the workdir archive is gone; {REREGISTER}",
                                         interrupted=interrupted)
        except FetchError as exc:
            raise WorkdirError(f"cannot download the workdir: {exc}") from None
        log("INFO", "prepare stage", stage="workdir_download", uri=uri, seconds=round(time.monotonic() - started, 3),
            bytes=size)
        if actual != digest:
            raise WorkdirError(
                f"workdir archive {uri} does not match its name: expected sha256 {digest}, got {actual} "
                f"({size} bytes). It was changed or cut short after respawn uploaded it; {REREGISTER}")
        started = time.monotonic()
        try:
            files, unpacked = unpack(archive, staging)
        except UnsafeArchive as exc:
            raise WorkdirError(f"unsafe workdir archive {uri}: {exc}; nothing was unpacked. respawn packs only "
                               f"relative files, directories and symlinks inside the tree: {REREGISTER}") from None
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise WorkdirError(f"corrupt workdir archive {uri} (not a gzip'd tar: {exc}); {REREGISTER}") from None
        except OSError as exc:
            raise WorkdirError(f"cannot unpack workdir archive {uri} into {root}: {exc}; check the node's disk "
                               f"(free space: df -h {root})") from None
        os.sync()  # the renamed directory must never be an incomplete one after a power loss
        os.rename(staging, final)
        log("INFO", "prepare stage", stage="workdir_unpack", uri=uri, path=final,
            seconds=round(time.monotonic() - started, 3), files=files, bytes=unpacked)
        return final, True
    finally:
        _remove(archive)
        _remove(staging)
