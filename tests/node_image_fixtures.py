"""A real node image for the tests: a Debian 11 (bullseye) root filesystem built with debootstrap, once, into the
ignored cache folder .cache/node-images/, and booted per test as an overlay (the cache stays pristine) under
`chroot`, with its own /usr/bin/python3 (3.9.2), bash, coreutils, mawk and curl.

The rootfs shares this machine's network and PID namespace: the sim's metadata server and the emulators on
127.0.0.1 are reachable from inside, and the sim's power-off (NodeRuntime) finds the guest's processes by their
RESPAWN_BOOT_ID as for any sim node. Building needs root, debootstrap (`apt-get install debootstrap`; .ci/run
installs it) and the Debian mirror (http://deb.debian.org/debian, or $RESPAWN_DEBIAN_MIRROR); a missing one fails
the run with that hint, never a skip. The first build takes a few minutes (started in the background as soon as
the session has collected a test that boots the image: start_building); its output goes to a log file beside the
cache, named in the line that announces the build and in any failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import system_packages

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "node-images"  # .gitignore'd
MIRROR = os.environ.get("RESPAWN_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
# What a Debian 11 node image has that the startup script and the agent use: python3 (3.9), curl, CA certificates.
# The cache folder is named after this recipe: change it and the next run builds a fresh image beside the old one.
BULLSEYE = ("--variant=minbase", "--include=python3,curl,ca-certificates", "bullseye")
BUILD_TIMEOUT_S = 1200


def image_dir(recipe: tuple[str, ...] = BULLSEYE) -> Path:
    """The cache folder of one recipe: .cache/node-images/<suite>-<sha256 of the recipe, 12 hex>."""
    return CACHE / f"{recipe[-1]}-{hashlib.sha256(' '.join(recipe).encode()).hexdigest()[:12]}"


_capture = None  # pytest's capture manager, set by the fixture: progress lines go around it


def _say(line: str) -> None:
    """A progress line on the terminal, not into the test's captured output (an xdist worker's stderr is the
    controller's)."""
    with _capture.global_and_fixture_disabled() if _capture is not None else contextlib.nullcontext():
        print(f"\n[node image] {line}", file=sys.stderr, flush=True)


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, deepest first (from /proc/self/mountinfo)."""
    prefix = str(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _unmount(point: str) -> None:
    if subprocess.run(["umount", point], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", point], capture_output=True)  # busy: detach it now, free it when idle


def _remove_tree(path: Path) -> None:
    """rm -rf of a (half-built) rootfs: first whatever debootstrap left mounted in it (proc, sys), then the files,
    never crossing into another filesystem."""
    for point in _mounts_under(path):
        _unmount(point)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _build(recipe: tuple[str, ...], dest: Path) -> None:
    system_packages.wait_installed()
    debootstrap = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.path.exists(p)), None)
    if debootstrap is None:
        pytest.fail("debootstrap is not installed: the node-image test builds a Debian 11 rootfs with it once "
                    f"(into {CACHE}); install it with `apt-get install -y debootstrap` (.ci/run does)", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("building and booting the node image needs root (debootstrap, mount, chroot)", pytrace=False)
    log = dest.with_name(dest.name + ".debootstrap.log")
    partial = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    _remove_tree(partial)
    argv = [debootstrap, *recipe, str(partial), MIRROR]
    _say(f"building the Debian node image (a few minutes, once): {' '.join(argv)}; log: {log}")
    started = time.monotonic()
    with open(log, "wb") as out:
        try:
            r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               timeout=BUILD_TIMEOUT_S)
            code = r.returncode
        except subprocess.TimeoutExpired:
            code = None
    if code != 0:
        _remove_tree(partial)
        tail = log.read_text(errors="replace")[-3000:]
        why = f"ran past {BUILD_TIMEOUT_S} s" if code is None else f"exited with {code}"
        pytest.fail(f"debootstrap {why} building the node image from {MIRROR} (is the mirror reachable? set "
                    f"RESPAWN_DEBIAN_MIRROR to another); full log: {log}; its end:\n{tail}", pytrace=False)
    for point in _mounts_under(partial):  # debootstrap unmounts its proc and sys itself; make sure
        _unmount(point)
    (partial / ".respawn-image").write_text(" ".join(argv[1:-2] + [MIRROR]) + "\n")
    partial.rename(dest)  # only a complete image ever has the cache's name
    _say(f"node image built in {time.monotonic() - started:.0f} s: {dest}")


def node_image(recipe: tuple[str, ...] = BULLSEYE) -> Path:
    """The cached rootfs of `recipe`, built first if absent. A lock keeps two xdist workers (or two runs) from
    building it twice; a half-built one (killed mid-build) never has the cache's name and is removed by the next
    build."""
    dest = image_dir(recipe)
    if dest.is_dir():
        return dest
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other builder's wait ends when it has renamed its image into place
        if not dest.is_dir():
            for stale in CACHE.glob(f"{dest.name}.partial-*"):
                _remove_tree(stale)
            _build(recipe, dest)
    return dest


def start_building(config) -> subprocess.Popen | None:
    """node_image(BULLSEYE) in a process of its own, started once the session has collected a test that uses it: the
    download (most of a build's minutes) overlaps the tests before it, which then waits on the build's lock. None
    when the image is cached or cannot be built here (that test then says why)."""
    if image_dir(BULLSEYE).is_dir() or os.geteuid() != 0:
        return None
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # its progress lines reach the terminal
        return subprocess.Popen([sys.executable, __file__], start_new_session=True, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def bullseye_image(pytestconfig) -> Path:
    global _capture
    _capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    return node_image(BULLSEYE)


def _rooted_in(root: Path) -> list[int]:
    """Processes whose root directory is `root` or below it (chroot'ed there)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            r = os.readlink(f"/proc/{entry.name}/root")
        except OSError:
            continue
        if r == str(root) or r.startswith(str(root) + "/"):
            pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def booted_image(image: Path, where: Path) -> Iterator[Path]:
    """`image` as a writable root filesystem at where/root (an overlay: writes go to where/upper), with a fresh
    /proc as a booted system has. On the way out every process still chroot'ed there is killed and everything is
    unmounted (lazily if busy). The image's /dev already holds its device nodes (debootstrap makes them), so the
    host's /dev is never mounted in: a leaked mount can never expose it to a later rm -rf of the temp folder."""
    root, upper, work = where / "root", where / "upper", where / "work"
    for d in (root, upper, work):
        d.mkdir(parents=True)
    mounted: list[Path] = []
    try:
        for argv in (["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={image},upperdir={upper},workdir={work}",
                      str(root)],
                     ["mount", "-t", "proc", "proc", str(root / "proc")]):
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.fail(f"cannot mount the node image at {root}: {' '.join(argv)}: {r.stderr.strip()}",
                            pytrace=False)
            mounted.append(Path(argv[-1]))
        yield root
    finally:
        deadline = time.monotonic() + 10
        while (pids := _rooted_in(root)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for point in reversed(mounted):
            _unmount(str(point))
        leaked = _mounts_under(where)
        if leaked:
            print(f"node image: still mounted after the test: {leaked}", file=sys.stderr)


if __name__ == "__main__":  # start_building's process; a failed build is reported by the test's own try
    try:
        node_image(BULLSEYE)
    except BaseException:
        sys.exit(1)
