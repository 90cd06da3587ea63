"""Start and stop the official Firestore and Pub/Sub emulators, and gcp-storage-emulator, on free loopback ports.

Used by the test harness and by `respawn demo`. Each emulator runs in its own process group (the wrapper
scripts start `java` as a child), and stop() ends the whole group. An emulator shared by several users (the test
session's, under demos of their own) is emptied one project at a time: reset_firestore, delete_pubsub.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

SDK_ROOTS = [Path("/usr/lib/google-cloud-sdk"), Path("/usr/share/google-cloud-sdk")]
FIRESTORE_BIN = "platform/cloud-firestore-emulator/cloud_firestore_emulator"
PUBSUB_BIN = "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
INSTALL_HINT = (
    "install it with: apt-get install google-cloud-cli-firestore-emulator google-cloud-cli-pubsub-emulator "
    "default-jre (see https://cloud.google.com/sdk/docs/install for the apt source); or set {var} to the "
    "emulator's launcher script"
)


# The Java emulators' JIT: the client compiler only (no C2) and one GC thread. Measured on a 2-core machine
# (bench.emulator_jit, docs/performance.md), the Firestore emulator then spends 0.45x the CPU on 3,000 writes and
# 0.63x on 15,000, and answers as fast or faster: over a demo's or a test run's length C2's compiling does not pay
# back. Appended to any JAVA_TOOL_OPTIONS of the caller's, the same way every JVM reads it.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _java_env(jvm_options: str) -> dict[str, str]:
    mine = os.environ.get("JAVA_TOOL_OPTIONS", "")
    return {**os.environ, "JAVA_TOOL_OPTIONS": f"{mine} {jvm_options}".strip()}


class EmulatorError(RuntimeError):
    pass


class PortTaken(EmulatorError):
    """The port was taken between free_port() and the emulator's bind (another process got there first)."""


# The ports free_port picks from: the 12,000 below the kernel's ephemeral range (ip_local_port_range; Linux's default
# starts at 32768), from which every bind to port 0 and every outgoing connection takes its port.
_EPHEMERAL_LOW = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PICKED_SPAN = 12_000


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 now, for servers that processes started next will
    bind (a job's generation ports: contract.generation_port). Outside the ephemeral range: a port from there was
    taken meanwhile by another server's bind to port 0 or a connection's source port (a demo's function host then
    lost its port, and its Pub/Sub pushes went to whatever held it); only another caller here can pick these, one
    chance in thousands."""
    try:
        low = int(_EPHEMERAL_LOW.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first_low = max(1024, low - _PICKED_SPAN)
    for _ in range(200):
        first = random.randrange(first_low, low - count + 1)
        if all(_bindable(port) for port in range(first, first + count)):
            return first
    raise EmulatorError(f"no {count} free port(s) in a row on 127.0.0.1 in {first_low}..{low - 1}: stop what holds "
                        "them")


def free_port() -> int:
    return free_ports(1)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _find(relative: str, env_var: str, name: str) -> str:
    override = os.environ.get(env_var)
    if override:
        if not os.access(override, os.X_OK):
            raise EmulatorError(f"{env_var}={override} is not an executable {name} emulator launcher")
        return override
    roots = list(SDK_ROOTS)
    gcloud = shutil.which("gcloud")
    if gcloud:
        roots.insert(0, Path(os.path.realpath(gcloud)).parent.parent)
    for root in roots:
        candidate = root / relative
        if candidate.exists():
            return str(candidate)
    if not shutil.which("java"):
        raise EmulatorError(f"the {name} emulator needs Java, which is not installed; " + INSTALL_HINT.format(var=env_var))
    raise EmulatorError(f"the {name} emulator is not installed; " + INSTALL_HINT.format(var=env_var))


@dataclass
class Emulator:
    name: str
    host: str
    proc: subprocess.Popen
    log_path: Path
    _log: object = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def stop(self, timeout: float = 10) -> None:
        """End the whole process group: the launcher exits on SIGTERM before its java child does."""
        stop_group(self.proc, timeout)
        if self._log is not None:
            self._log.close()

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM a process group started with start_new_session, SIGKILL it if it outlives `timeout`."""
    stop_groups([proc], timeout)


def stop_groups(procs: list[subprocess.Popen], timeout: float = 10, first: int = signal.SIGTERM) -> None:
    """stop_group for several groups at once: each is signalled (`first`, then SIGKILL after `timeout`) before any is
    waited on, so they wind down together (one after the other, a gunicorn's graceful exit each, was most of the
    demo's teardown)."""
    left = list(procs)  # started with start_new_session: each group's id is its leader's pid
    for sig in (first, signal.SIGKILL):
        for proc in list(left):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                left.remove(proc)
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            left = [proc for proc in left if proc.poll() is None or group_alive(proc.pid)]
            if left:
                time.sleep(0.05)
        if not left:
            break
    for proc in procs:
        proc.poll()


def _start(name: str, argv: list[str], port: int, ready_path: str, timeout: float, log_dir: Path | None,
           env: dict[str, str] | None) -> Emulator:
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"respawn-{name}-"))
    log_path = log_dir / f"{name}-emulator.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env)
    emu = Emulator(name=name, host=f"127.0.0.1:{port}", proc=proc, log_path=log_path, _log=log)
    try:  # stopped on every way out but a ready emulator, Ctrl-C while it starts included
        _wait_ready(emu, port, ready_path, timeout)
    except BaseException:
        emu.stop()
        raise
    return emu


def _wait_ready(emu: Emulator, port: int, ready_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _port_taken(emu.log_path):  # the Firestore emulator exits then, the Pub/Sub one lives on without its port
            raise PortTaken(f"the {emu.name} emulator could not bind 127.0.0.1:{port}: Address already in use")
        if emu.proc.poll() is not None:
            raise EmulatorError(f"the {emu.name} emulator exited with code {emu.proc.returncode} while starting:\n"
                                f"{emu.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.2)
    raise EmulatorError(f"the {emu.name} emulator did not answer on 127.0.0.1:{port} within {timeout:.0f} s:\n"
                        f"{emu.log_tail()}")


PORT_TRIES = 3


def _port_taken(log_path: Path) -> bool:
    """The emulator's log says its port was taken (a JVM binds it seconds after free_port() found it free)."""
    try:
        return b"java.net.BindException: Address already in use" in log_path.read_bytes()
    except OSError:
        return False


def _start_on_a_free_port(name: str, argv: Callable[[int], list[str]], ready_path: str, timeout: float,
                          log_dir: Path | None, env: dict[str, str] | None = None) -> Emulator:
    """_start on a free port; when the port was taken before the emulator bound it, again on another one."""
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        try:
            return _start(name, argv(port), port, ready_path, timeout, log_dir, env)
        except EmulatorError as exc:
            if attempt == PORT_TRIES or not isinstance(exc, PortTaken):
                raise
            print(f"the {name} emulator's port {port} was taken before it bound it; trying another", file=sys.stderr)
    raise AssertionError("unreachable")


def start_firestore(timeout: float = 60, log_dir: Path | None = None, jvm_options: str = JVM_OPTIONS) -> Emulator:
    launcher = _find(FIRESTORE_BIN, "RESPAWN_FIRESTORE_EMULATOR", "Firestore")
    return _start_on_a_free_port("firestore", lambda port: [launcher, "start", "--host=127.0.0.1", f"--port={port}"],
                                 "/", timeout, log_dir, _java_env(jvm_options))


def start_pubsub(timeout: float = 60, log_dir: Path | None = None, jvm_options: str = JVM_OPTIONS) -> Emulator:
    launcher = _find(PUBSUB_BIN, "RESPAWN_PUBSUB_EMULATOR", "Pub/Sub")
    return _start_on_a_free_port("pubsub", lambda port: [launcher, "--host=127.0.0.1", f"--port={port}"], "/",
                                 timeout, log_dir, _java_env(jvm_options))


def start_storage(bucket: str, timeout: float = 30, log_dir: Path | None = None) -> Emulator:
    """gcp-storage-emulator (a dev dependency, beside this interpreter) with `bucket`, in memory. STORAGE_EMULATOR_HOST
    (google-cloud-storage) and RESPAWN_STORAGE_HOST (a node's startup script and agent) take its `url`."""
    launcher = Path(sys.executable).with_name("gcp-storage-emulator")
    if not launcher.exists():
        raise EmulatorError(f"{launcher} is missing: install the dev extra (pip install -e '.[dev]')")
    return _start_on_a_free_port("storage", lambda port: [str(launcher), "start", "--host", "127.0.0.1", "--port",
                                                           str(port), "--default-bucket", bucket, "--in-memory",
                                                           "--quiet"], f"/storage/v1/b/{bucket}", timeout, log_dir)


HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:[0-9]{1,5}")


def check_running(name: str, host: str) -> None:
    """The emulator said to run at `host` (HOST:PORT, as FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST take it)
    answers; else an EmulatorError naming it."""
    if not HOST_PORT.fullmatch(host):
        raise EmulatorError(f"the {name} emulator's address {host!r} is not HOST:PORT (e.g. 127.0.0.1:8085)")
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=5) as r:
            if r.status == 200:
                return
            problem = f"HTTP {r.status}"
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        problem = str(getattr(exc, "reason", exc))
    raise EmulatorError(f"no {name} emulator answers at {host} ({problem}): start it there, or leave its address out "
                        "to start one of the demo's own")


def delete_pubsub(host: str, project: str, kind: str) -> None:
    """Delete every one of `project`'s `kind` ("subscriptions" or "topics") on the Pub/Sub emulator at `host`; other
    projects' are the emulator's own business and stay."""
    url = f"http://{host}/v1/projects/{project}/{kind}"
    while True:
        with urllib.request.urlopen(url, timeout=10) as r:
            names = [x["name"] for x in json.load(r).get(kind) or []]
        if not names:
            return
        for name in names:
            with urllib.request.urlopen(urllib.request.Request(f"http://{host}/v1/{name}", method="DELETE"),
                                        timeout=10):
                pass


def reset_firestore(host: str, project: str, databases: tuple[str, ...] = ()) -> None:
    """Delete every document in the emulator's (default) database for `project`, the heartbeats' database of a
    deployment without node identities, and `databases` (those of node identities)."""
    from respawn.contract import NODES_DATABASE

    for database in ("(default)", NODES_DATABASE, *databases):
        req = urllib.request.Request(
            f"http://{host}/emulator/v1/projects/{project}/databases/{database}/documents", method="DELETE"
        )
        with urllib.request.urlopen(req, timeout=60) as r:  # the Java emulator is slow on a loaded 2-core machine
            if r.status != 200:
                raise EmulatorError(f"resetting database {database} of the Firestore emulator at {host} answered "
                                    f"HTTP {r.status}")
