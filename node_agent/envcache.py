"""The environment cache (trainer.cache): what setup produced, archived once and restored by later fresh nodes
instead of running setup again.

Key. sha256 over a canonical JSON (sorted keys, no spaces) of everything setup's outcome depends on that the node
can see: the setup argvs, the workdir's digest, the trainer's env, the interpreter (as named, as found, its full
version), the library's digest, each cache path and where it lands (a venv is not relocatable: its scripts name
their interpreter by absolute path), the OS release and the machine architecture. The node's image is not in it:
the agent is not told the image, and an image family's next image usually keeps the OS release and the Python
version; a job that must not reuse an environment across images changes a setup argv.

Store. Under the job's checkpoint_uri (contract.env_cache_uri): `<key>/<random>.tar`, then `<key>.json` (the
manifest: the archive's name, size and sha256), written last so that it commits the archive, as a checkpoint's
marker does; an archive without a manifest is never read. Each uploader writes an archive of its own name, so two
nodes that set up at once never mix their bytes; the last manifest wins, whole.

Archive. An uncompressed tar (a venv's wheels and shared objects are mostly compressed already; gzip costs more
CPU time than it saves in transfer at a VM's Cloud Storage throughput), one member tree per cache path, named by
its index: `0`, `0/bin/python`, `1/…`. Regular files, directories and symlinks (kept as they are, never followed);
hard links are stored as files; sockets, FIFOs and devices are left out. Modes (without set-id bits) and mtimes
are kept: Python checks a .pyc against its source's mtime.

Restore (before setup, only when setup would run): the manifest missing → `miss`, setup runs; the download, the
size or sha256, or unpacking failing → WARNING naming what failed, partial trees removed, `fallback`, setup runs.
Unpacking refuses absolute names, `..`, members below a symlink or a file, hard links and devices
(workdir.check_members), and writes into a fresh directory beside each destination, renamed into place (replacing
what was there) once every tree is complete.

Upload (after setup ran and succeeded): a background thread streams the tar to the store while the trainer
starts; a notice stops it at the next write (`upload-stopped`), leaving no manifest. It never delays the notice
path or the trainer. Its failure is logged (`upload-failed`) and changes nothing else: the next fresh node runs
setup. A manifest already there (another node uploaded) → `ready` at once, unless this node found that one's
archive broken (fallback): then its own archive and manifest replace it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import stat
import tarfile
import threading
import time
from typing import Any, Callable

from respawn import contract
from respawn.logs import log

from .storage import Fetcher, FetchError, Interrupted, UploadError, Uploader
from .workdir import UnsafeArchive, check_members

FORMAT = 1
CACHE_DIR = "envcache"  # in the node directory: downloads while they are checked
PROGRESS_EVERY_S = 5.0
TAR_BUFFER = 1 << 20
_ARCHIVE_NAME = re.compile(r"^[0-9a-f]{64}/[0-9a-f]{16}\.tar$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class CacheError(Exception):
    """A cache path that cannot be placed on this node (no HOME for ~/…); the message names it."""


def destinations(paths: tuple[str, ...], cwd: str, home: str | None) -> list[str]:
    """The absolute place of each cache path (contract.check_cache_paths form): relative ones in `cwd` (the
    workdir), ~/… in `home`."""
    out = []
    for path in paths:
        if path.startswith(contract.HOME_PREFIX):
            if not home or not os.path.isabs(home):
                raise CacheError(f"trainer.cache names {path!r}, but the trainer's HOME is {home!r}: set HOME in "
                                 "trainer.env, or name a path in the workdir")
            out.append(os.path.normpath(os.path.join(home, path[len(contract.HOME_PREFIX):])))
        else:
            out.append(os.path.normpath(os.path.join(cwd, path)))
    return out


def os_identity() -> dict[str, str]:
    """The OS release (ID, VERSION_ID of /etc/os-release) and the machine architecture of this node."""
    release: dict[str, str] = {}
    try:
        with open("/etc/os-release") as f:
            for line in f:
                name, _, value = line.strip().partition("=")
                if name in ("ID", "VERSION_ID"):
                    release[name] = value.strip('"')
    except OSError:
        pass
    return {"os": release.get("ID", ""), "os_version": release.get("VERSION_ID", ""), "machine": platform.machine()}


def key_inputs(*, setup: list[list[str]], workdir: str | None, env: dict[str, str], interpreter: str,
               executable: str, version: list[int], library: str | None, paths: tuple[str, ...],
               dests: list[str], system: dict[str, str]) -> dict[str, Any]:
    """What the environment setup produced depends on, as the key's canonical JSON holds it."""
    return {"format": FORMAT, "setup": [list(c) for c in setup], "workdir": workdir, "env": dict(env),
            "interpreter": {"name": interpreter, "executable": executable, "version": list(version)},
            "library": library, "paths": [[p, d] for p, d in zip(paths, dests)], "system": dict(system)}


def cache_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- the archive --------------------------------------------------------------------------------------------------

def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, stat.S_IMODE(st.st_mode) & 0o777, int(st.st_mtime)
    return info


def write_archive(dests: list[str], out: Any) -> dict[str, int]:
    """Write the trees at `dests` (those that exist) as one tar to the binary stream `out`. Returns counts: files,
    bytes (of file data), skipped (neither file, directory nor symlink), missing (cache paths that do not exist)."""
    counts = {"files": 0, "bytes": 0, "skipped": 0, "missing": 0}
    with tarfile.open(fileobj=out, mode="w|", bufsize=TAR_BUFFER, format=tarfile.PAX_FORMAT) as tar:
        for index, top in enumerate(dests):
            stack = [(top, str(index))]
            while stack:
                path, name = stack.pop()
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    counts["missing" if name == str(index) else "skipped"] += 1
                    continue
                if stat.S_ISLNK(st.st_mode):
                    info = _info(name, st, tarfile.SYMTYPE)
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    tar.addfile(_info(name, st, tarfile.DIRTYPE))
                    stack.extend((os.path.join(path, child), f"{name}/{child}")
                                 for child in sorted(os.listdir(path), reverse=True))
                elif stat.S_ISREG(st.st_mode):
                    info = _info(name, st, tarfile.REGTYPE)
                    info.size = st.st_size
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                    counts["files"] += 1
                    counts["bytes"] += st.st_size
                else:
                    counts["skipped"] += 1
    return counts


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def unpack_archive(archive: str, dests: list[str]) -> dict[str, int]:
    """Unpack a cache archive into `dests` (index i's tree → dests[i]), replacing what is there, all or nothing:
    each tree is written into a fresh directory beside its destination, and renamed into place once every tree is
    complete. Raises UnsafeArchive, tarfile.TarError or OSError, leaving no partial tree behind."""
    staging = [os.path.join(os.path.dirname(d), f".respawn-env-partial-{os.path.basename(d)}-{os.getpid()}")
               for d in dests]
    placed: list[str] = []
    counts = {"files": 0, "bytes": 0, "trees": 0}
    try:
        with tarfile.open(archive, "r:") as tar:
            plan = check_members(tar.getmembers(), links_out=True)
            dirs: list[tuple[str, int]] = []
            present: set[int] = set()
            for rel, m in plan:
                top, _, rest = rel.partition("/")
                if not top.isdigit() or int(top) >= len(dests) or str(int(top)) != top:
                    raise UnsafeArchive(m.name, f"is not under one of the {len(dests)} cache paths (0…"
                                                f"{len(dests) - 1})")
                index = int(top)
                if not rest:
                    present.add(index)
                    _remove(staging[index])  # an earlier agent's leftover
                    os.makedirs(os.path.dirname(staging[index]), exist_ok=True)
                elif index not in present:
                    raise UnsafeArchive(m.name, f"comes before its cache path's own entry {top!r}")
                path = os.path.join(staging[index], *rest.split("/")) if rest else staging[index]
                if m.isdir():
                    os.makedirs(path, exist_ok=True)
                    dirs.append((path, m.mode & 0o777))
                elif m.issym():
                    os.symlink(m.linkname, path)
                else:
                    src = tar.extractfile(m)
                    assert src is not None
                    with src, open(path, "xb") as out:  # x: never write through something already there
                        shutil.copyfileobj(src, out, TAR_BUFFER)
                    os.chmod(path, m.mode & 0o777)
                    os.utime(path, (m.mtime, m.mtime))
                    counts["files"] += 1
                    counts["bytes"] += m.size
            for path, mode in reversed(dirs):  # last: a read-only directory must not stop what goes into it
                os.chmod(path, mode)
        for index in sorted(present):
            _remove(dests[index])
            os.rename(staging[index], dests[index])
            placed.append(dests[index])
        counts["trees"] = len(present)
        return counts
    except BaseException:
        for path in placed:
            _remove(path)
        raise
    finally:
        for path in staging:
            _remove(path)


# --- the cache ----------------------------------------------------------------------------------------------------

class EnvCache:
    """One node life's use of the cache: `restore` before setup, `upload_in_background` after setup ran. `status`
    is the heartbeat's env_cache; `on_change` is called when its state changes."""

    def __init__(self, checkpoint_uri: str, node_dir: str, fetcher: Fetcher, uploader: Uploader, *,
                 interrupted: Callable[[], bool] = lambda: False, on_change: Callable[[], None] = lambda: None):
        self.base = contract.env_cache_uri(checkpoint_uri)
        self.work = os.path.join(node_dir, CACHE_DIR)
        self.fetcher, self.uploader = fetcher, uploader
        self.interrupted, self.on_change = interrupted, on_change
        self._lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._broken: str | None = None  # the key whose archive failed to restore here: upload a new one
        self.thread: threading.Thread | None = None

    @property
    def status(self) -> dict[str, Any] | None:
        with self._lock:
            return dict(self._status) if self._status is not None else None

    def _set(self, state: str, key: str, moved: int = 0) -> None:
        assert state in contract.ENV_CACHE_STATES
        with self._lock:
            changed = self._status is None or self._status["state"] != state
            self._status = {"state": state, "key": key[:12], "bytes": moved}
        if changed:
            self.on_change()

    def _moved(self, moved: int) -> None:
        with self._lock:
            if self._status is not None:
                self._status["bytes"] = moved

    def _manifest(self, key: str, scratch: str) -> dict[str, Any] | None:
        """The key's manifest, None when there is none; FetchError or ValueError (one that is not a manifest)."""
        path = os.path.join(scratch, f"{key}.json")
        try:
            self.fetcher.fetch(f"{self.base}/{key}.json", path, interrupted=self.interrupted,
                               missing_hint="no environment archive for these inputs yet")
        except FetchError as exc:
            if exc.status == 404:
                return None
            raise
        with open(path) as f:
            manifest = json.load(f)
        ok = (isinstance(manifest, dict) and manifest.get("format") == FORMAT and manifest.get("key") == key
              and isinstance(manifest.get("archive"), str) and _ARCHIVE_NAME.match(manifest["archive"])
              and manifest["archive"].startswith(key + "/") and isinstance(manifest.get("sha256"), str)
              and _HEX64.match(manifest["sha256"]) and isinstance(manifest.get("size"), int)
              and not isinstance(manifest.get("size"), bool) and manifest["size"] >= 0)
        if not ok:
            raise ValueError(f"{self.base}/{key}.json is not an environment cache manifest of format {FORMAT} "
                             f"for this key: {json.dumps(manifest)[:300]}")
        return manifest

    def _scratch(self) -> str:
        os.makedirs(self.work, exist_ok=True)
        scratch = os.path.join(self.work, f".partial-{os.getpid()}-{secrets.token_hex(4)}")
        os.makedirs(scratch)
        return scratch

    def restore(self, key: str, dests: list[str]) -> bool:
        """Put the key's environment in place. True: restored, setup need not run; False: run setup (no archive,
        or one that failed, logged). Raises Interrupted on a notice, leaving no partial tree."""
        self._set("restoring", key)
        if os.path.isdir(self.work):  # what an agent killed mid-way left behind
            for name in os.listdir(self.work):
                _remove(os.path.join(self.work, name))
        scratch = self._scratch()
        started = time.monotonic()
        what = f"reading {self.base}/{key}.json"
        try:
            manifest = self._manifest(key, scratch)
            if manifest is None:
                self._set("miss", key)
                log("INFO", "environment cache miss: setup runs, and its result is uploaded for the next node",
                    key=key, store=self.base)
                return False
            uri = f"{self.base}/{manifest['archive']}"
            what = f"downloading {uri}"
            archive = os.path.join(scratch, "env.tar")
            size, digest = self.fetcher.fetch(uri, archive, interrupted=self.interrupted,
                                              missing_hint="its manifest names an archive that is gone")
            self._moved(size)
            if (size, digest) != (manifest["size"], manifest["sha256"]):
                raise ValueError(f"{uri} does not match its manifest: expected {manifest['size']} bytes with "
                                 f"sha256 {manifest['sha256']}, got {size} bytes with sha256 {digest}")
            downloaded = time.monotonic()
            what = f"unpacking {uri}"
            counts = unpack_archive(archive, dests)
        except Interrupted:
            raise
        except (FetchError, ValueError, UnsafeArchive, tarfile.TarError, EOFError, OSError) as exc:
            self._set("fallback", key)
            self._broken = key
            log("WARNING", "environment cache not usable; running setup instead", failed=what, error=str(exc),
                key=key)
            return False
        finally:
            _remove(scratch)
        self._set("restored", key, size)
        log("INFO", "prepare stage", stage="env_restore", key=key, bytes=size, files=counts["files"],
            trees=counts["trees"], download_seconds=round(downloaded - started, 3),
            seconds=round(time.monotonic() - started, 3))
        return True

    def upload_in_background(self, key: str, dests: list[str], paths: tuple[str, ...]) -> threading.Thread:
        self._set("uploading", key)
        self.thread = threading.Thread(target=self._upload, args=(key, dests, paths), name="env-cache-upload",
                                       daemon=True)  # the agent never waits for it: a notice ends it
        self.thread.start()
        return self.thread

    def _upload(self, key: str, dests: list[str], paths: tuple[str, ...]) -> None:
        started = time.monotonic()
        scratch = None
        uri = f"{self.base}/{key}/{secrets.token_hex(8)}.tar"
        what = f"reading {self.base}/{key}.json"
        try:
            scratch = self._scratch()
            if self._broken != key and self._manifest(key, scratch) is not None:
                self._set("ready", key)
                log("INFO", "environment cache: this environment's archive is there already", key=key,
                    store=self.base)
                return
            what = f"uploading {uri}"
            stream = self.uploader.open(uri, self.interrupted)
            progress = _Progress(stream, self._moved, uri)
            try:
                counts = write_archive(dests, progress)
                stream.commit()
            except BaseException:
                stream.abort()
                raise
            manifest = {"format": FORMAT, "key": key, "archive": uri[len(self.base) + 1:], "size": stream.size,
                        "sha256": stream.sha256, "paths": list(paths), "files": counts["files"],
                        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            what = f"writing {self.base}/{key}.json"
            self.uploader.put(f"{self.base}/{key}.json", json.dumps(manifest, sort_keys=True).encode())
        except Interrupted:
            self._set("upload-stopped", key, 0)
            log("WARNING", "environment cache upload stopped by the notice; no manifest written, the next fresh "
                "node runs setup", key=key, uri=uri)
            return
        except (UploadError, FetchError, ValueError, tarfile.TarError, OSError) as exc:
            self._set("upload-failed", key, 0)
            log("WARNING", "environment cache upload failed; the next fresh node runs setup", failed=what,
                error=str(exc), key=key)
            return
        finally:
            if scratch is not None:
                _remove(scratch)
        self._set("ready", key, stream.size)
        log("INFO", "environment cache uploaded", key=key, uri=uri, bytes=stream.size, files=counts["files"],
            skipped=counts["skipped"], missing=counts["missing"], seconds=round(time.monotonic() - started, 3))


class _Progress:
    """The tar's output: passes writes to the upload stream, reports the bytes sent, logs every PROGRESS_EVERY_S."""

    def __init__(self, stream: Any, report: Callable[[int], None], uri: str):
        self.stream, self.report, self.uri = stream, report, uri
        self.started = self.last = time.monotonic()

    def write(self, data: bytes) -> int:
        n = self.stream.write(data)
        self.report(self.stream.size)
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            log("INFO", "environment cache upload progress", uri=self.uri, bytes=self.stream.size,
                seconds=round(now - self.started, 1))
        return n
