"""`python -m respawn ARGS` as real processes, without paying the CLI's imports each time.

A server process imports what `respawn`'s command line imports (pydantic's job schema, typer, rich: about a second
of CPU) once; each command is then a child forked from it, which sets the working directory, the environment and
its standard streams as the test gives them, and runs `respawn` as `-m` does (runpy, `respawn.app.cli` itself
imported afresh, so that its consoles read this environment). The child exits as the interpreter does: its exit
status, an uncaught exception's traceback on stderr. `respawn demo` execs `python -m sim.demo`: the child runs that
module in its place, in the environment given to exec, every module imported since the fork imported afresh. Tests
get a subprocess.CompletedProcess as from subprocess.run.

tests/test_cli_errors.py keeps commands run through `subprocess.run([sys.executable, "-m", "respawn", ...])` too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# What respawn/app/cli.py imports at its top, but not the module itself: none reads the environment on import.
PRELOAD = ("respawn.schema", "respawn.deployment", "respawn.app.selftest_run", "respawn.app.workdir", "typer",
           "typer.core", "rich.console", "rich.table", "rich.text", "yaml",
           # and the clients its commands import when they run; imported only (no channel made, no thread started),
           # they are safe to fork
           "google.cloud.firestore", "google.cloud.storage", "google.cloud.pubsub_v1")


# ------------------------------------------------------------------------------------------------ the server


def _child(req: dict) -> None:
    """In the forked child: become `python -m respawn ARGV` run in req's cwd with req's environment."""
    import io

    os.setpgid(0, 0)  # a group of its own, as the test kills it on a timeout
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.close(null)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  write_through=bool(req["env"].get("PYTHONUNBUFFERED")))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    os.execve = _exec_in_place
    try:
        _run_module("respawn", req["argv"])
    except _Exec as exec_:  # `respawn demo` execs `python -m sim.demo ARGS`: run it here, from a clean stack
        module, argv, env = exec_.args
        os.environ.clear()
        os.environ.update(env)
        for name in [m for m in sys.modules if m not in _PRELOADED]:  # imported afresh, as by a new interpreter
            del sys.modules[name]
        _run_module(module, argv)
    raise SystemExit(0)


def _run_module(module: str, argv: list[str]) -> None:
    """`python -m MODULE ARGV` in the working directory, with this environment's PYTHONPATH."""
    import runpy

    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *_BASE_PATH]
    sys.argv = ["-m", *argv]  # runpy puts the module's path first, as -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class _Exec(BaseException):
    """os.execve of this interpreter with `-m MODULE`: (module, argv, env)."""


_REAL_EXECVE = os.execve


def _exec_in_place(path, args, env):
    args = list(args)
    if path != sys.executable or len(args) < 3 or args[1] != "-m":
        return _REAL_EXECVE(path, args, env)
    sys.stdout.flush()
    sys.stderr.flush()
    raise _Exec(args[2], args[3:], dict(env))


_PRELOADED: set[str] = set()
_BASE_PATH: list[str] = []


def serve() -> None:
    """Read one JSON request a line on stdin; answer {"id", "pid"} when forked and {"id", "rc"} when it ended."""
    import importlib

    started_with = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    _BASE_PATH[:] = [p for p in sys.path[1:] if p not in started_with]
    for name in PRELOAD:
        importlib.import_module(name)
    _PRELOADED.update(sys.modules)
    import gc

    gc.collect()
    gc.freeze()  # what is imported stays out of the children's collections: their pages stay shared, not copied
    running: dict[int, str] = {}
    pending, eof = b"", False

    def say(message: dict) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())

    while not eof or running:
        readable, _, _ = select.select([] if eof else [0], [], [], 0.02 if running else None)
        if readable:
            data = os.read(0, 1 << 16)
            eof = not data
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)  # never returns: it exits as the interpreter does
                running[pid] = req["id"]
                say({"id": req["id"], "pid": pid})
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            say({"id": running.pop(pid), "rc": os.waitstatus_to_exitcode(status)})


# ------------------------------------------------------------------------------------------------ the client


class Forks:
    """The tests' side: run(argv, cwd, env) → subprocess.CompletedProcess of `python -m respawn ARGV`."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="respawn-forks-"))
        root = Path(__file__).resolve().parent.parent
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], cwd=root,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()
        self._replies: dict[str, dict] = {}
        self._changed = threading.Condition(self._lock)
        self._count = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            reply = json.loads(line)
            with self._changed:
                self._replies.setdefault(reply["id"], {}).update(reply)
                self._changed.notify_all()
        with self._changed:
            self._replies["<closed>"] = {}
            self._changed.notify_all()

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
        with self._lock:
            self._count += 1
            rid = str(self._count)
        out, err = self._dir / f"{rid}.out", self._dir / f"{rid}.err"
        req = {"id": rid, "argv": list(argv), "cwd": str(cwd), "env": dict(env), "stdout": str(out),
               "stderr": str(err)}
        with self._lock:
            self._proc.stdin.write((json.dumps(req) + "\n").encode())
            self._proc.stdin.flush()
        args = [sys.executable, "-m", "respawn", *argv]
        with self._changed:
            ended = self._changed.wait_for(lambda: "rc" in self._replies.get(rid, {}) or "<closed>" in self._replies,
                                           timeout=timeout)
            reply = self._replies.pop(rid, {})
        if "rc" not in reply:
            if "pid" in reply:
                os.killpg(reply["pid"], signal.SIGKILL)
            raise (subprocess.TimeoutExpired(args, timeout) if not ended else
                   RuntimeError("the respawn fork server ended"))
        stdout, stderr = out.read_text(), err.read_text()
        out.unlink()
        err.unlink()
        return subprocess.CompletedProcess(args, reply["rc"], stdout, stderr)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for f in self._dir.iterdir():
            f.unlink()
        self._dir.rmdir()


_SHARED: list[Forks] = []


def shared() -> Forks:
    """The test process's fork server (each xdist worker's own), started on first use and ended at exit."""
    with _SHARED_LOCK:
        if not _SHARED:
            import atexit

            _SHARED.append(Forks())
            atexit.register(_SHARED[0].close)
        return _SHARED[0]


_SHARED_LOCK = threading.Lock()


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m respawn ARGV` in cwd with env, forked from the shared fork server."""
    return shared().run(argv, cwd, env, timeout)


def respawn(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m respawn ARGS` as a terminal 200 columns wide runs it here (this environment, `env` on top), forked
    from the shared fork server."""
    return run(list(args), Path.cwd(), {**os.environ, "COLUMNS": "200", **(env or {})}, timeout)


if __name__ != "__main__":  # in the tests (the server imports no pytest)
    import pytest

    @pytest.fixture(scope="session")
    def respawn_forks() -> Forks:
        """The shared fork server."""
        return shared()


if __name__ == "__main__":
    serve()
