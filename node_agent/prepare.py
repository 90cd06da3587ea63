"""Before the first trainer start of a node life: the interpreter, the user's code, the checkpoint library, setup.

    workdir               settings.workdir → <node_dir>/workdirs/sha256-HEX/ (workdir.py; reused when there)
    find the interpreter  settings.interpreter: a name looked up on the trainer's PATH, or a path (a relative one
                          from the workdir)
    library               ATTR_LIBRARY's wheel → `INTERP -m pip install` (once per interpreter and digest)
    (the agent uploads a previous life's local-only checkpoints here, with the interpreter: the library is there)
    setup                 each settings.setup argv, cwd = the workdir (once per inputs, see below); with
                          settings.cache, first restored from the environment cache when it has these inputs'
                          archive (envcache.py), and uploaded to it after setup ran

What runs afterwards — setup commands, the previous-life upload, the trainer — gets the trainer's environment with
the interpreter's directory first on PATH (when the interpreter is given as a path; a bare name is what PATH finds
already), a leading `python`/`python3` replaced by the interpreter, and cwd = the workdir (the node directory
without one). A failure raises PrepareFailed: the command that failed (argv; the agent's own steps read
`respawn-agent fetch-workdir URI`, `respawn-agent install-library URI` and `respawn-agent find-interpreter NAME`),
its exit code and the tail of its output or the agent's explanation. A notice raises storage.Interrupted, after
the running command's process group has been stopped.

On a restart in place the node directory is the same disk: the workdir is reused, the library is not installed
again for the same interpreter and wheel digest (library.json), and setup is skipped when its inputs — workdir
digest, setup list, interpreter, library digest — are those of its last success (setup.done.json) and the workdir
was not unpacked afresh. Where setup would run, an environment restored from the cache counts as its success.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import zipfile
from email.parser import BytesParser
from typing import Any, Callable

from respawn import contract
from respawn.contract import NodeSettings
from respawn.logs import log

from .container import ROLE_SETUP, ROLE_TRAINER
from .envcache import CacheError, EnvCache, cache_key, destinations, key_inputs, os_identity
from .storage import Fetcher, FetchError, Interrupted
from .image_run import LIBRARY_PROBE_KEY, SITE, ImageRun, LibraryError, library_env, unpack_wheel
from .supervisor import RUN_MARKER, TAIL_BYTES, TAIL_LINES
from .workdir import WorkdirError, ensure_workdir

SETUP_LOG = "setup.log"  # the setup commands' output, appended across lives (shipped by logship.py)

# The agent zipapp is named after its metadata attribute; failed agent steps are reported as its commands.
AGENT = contract.ATTR_AGENT

SETUP_DONE = "setup.done.json"
LIBRARY_MARKER = "library.json"
LIBRARY_DIR = "library"
LIBRARY_FLOOR = (3, 10)
PYTHON_NAMES = ("python", "python3")
EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE = 127, 126  # as a shell reports them
EXIT_TIMED_OUT = 124  # as timeout(1) reports a command it stopped
INTERPRETER_HINT = "set trainer.interpreter, e.g. /opt/conda/bin/python"
_PROBE = ("import json, os, sys, sysconfig; print(json.dumps({'version': list(sys.version_info[:3]), "
          "'venv': sys.prefix != getattr(sys, 'base_prefix', sys.prefix), 'stdlib': sysconfig.get_path('stdlib')}))")
_STORAGE_EXTRA = re.compile(r"""extra\s*==\s*(['"])storage\1""")
_AND_STORAGE_EXTRA = re.compile(r"""\s+and\s+extra\s*==\s*(['"])storage\1""")
_STORAGE_EXTRA_AND = re.compile(r"""extra\s*==\s*(['"])storage\1\s+and\s+""")


class PrepareFailed(Exception):
    """A preparation step failed: the node reports SETUP_FAILED with these and does not start the trainer."""

    def __init__(self, command: list[str], message: str, *, exit_code: int | None = None,
                 output_tail: str | None = None):
        self.command, self.exit_code = [str(a) for a in command], exit_code
        self.output_tail = output_tail if output_tail is not None else message
        super().__init__(message)


def trim_tail(lines: list[str]) -> str:
    tail = "\n".join(lines[-TAIL_LINES:])
    encoded = tail.encode("utf-8")
    return encoded[-TAIL_BYTES:].decode("utf-8", errors="ignore") if len(encoded) > TAIL_BYTES else tail


def with_interpreter(argv: list[str] | tuple[str, ...], interpreter: str) -> list[str]:
    """A leading `python`/`python3` becomes the interpreter; anything else is left as it is."""
    argv = list(argv)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = interpreter
    return argv


def resolve_interpreter(name: str, path: str, base_dir: str) -> str:
    """The interpreter's executable: a name is looked up on `path` (the trainer's PATH), a relative path is taken
    from `base_dir` (the workdir). PrepareFailed when there is none."""
    if "/" in name:
        exe = name if os.path.isabs(name) else os.path.normpath(os.path.join(base_dir, name))
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
        where = f"{exe} does not exist or is not executable"
    else:
        found = shutil.which(name, path=path)
        if found:
            return found
        where = f"no {name!r} on PATH={path}"
    raise PrepareFailed([AGENT, "find-interpreter", name],
                        f"interpreter {name!r} not found ({where}): {INTERPRETER_HINT}, a Python that exists on "
                        "the node image", exit_code=EXIT_NOT_FOUND)


def storage_requirements(wheel: str) -> list[str]:
    """The wheel's `storage` extra (Requires-Dist lines marked `extra == "storage"`), as pip requirements with that
    clause dropped, so that pip installs only what the interpreter's environment lacks."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(f"{wheel} has {len(names)} .dist-info/METADATA files, expected 1")
        meta = BytesParser().parsebytes(z.read(names[0]), headersonly=True)
    requirements = []
    for value in meta.get_all("Requires-Dist") or []:
        requirement, _, marker = value.partition(";")
        if not _STORAGE_EXTRA.search(marker):
            continue
        # `A and extra == "storage"` (how setuptools writes an extra's conditional requirement) → `A`: pip would
        # find no `extra` to evaluate on a command line.
        rest = _STORAGE_EXTRA_AND.sub("", _AND_STORAGE_EXTRA.sub("", marker)).strip()
        rest = "" if _STORAGE_EXTRA.fullmatch(rest) else rest
        if "extra" in rest:
            log("WARNING", "a storage requirement's marker is not understood; leaving it to pip's resolver",
                requirement=value.strip())
            continue
        requirements.append(requirement.strip() + (f"; {rest}" if rest else ""))
    return requirements


def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def stop_group(child: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM to the command's process group, then SIGKILL to whatever of it is left after `grace` seconds or the
    leader's exit (what a command started must not outlive it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            continue


def run_logged(argv: list[str], *, cwd: str, env: dict[str, str], interrupted: Callable[[], bool], message: str,
               timeout: float | None = None, copy_to: str | None = None, **fields: Any) -> tuple[int, str]:
    """Run `argv` in its own process group, each line of its output (stdout and stderr) logged as `message` with
    `line` (and appended as it came to the file `copy_to`: the setup's log, logship.py); returns (exit status, tail
    of the output). A command that cannot be started reads as the shell has it: 127 not found, 126 not executable;
    one still running after `timeout` seconds is stopped and reads 124.
    Raises Interrupted (after stopping the group) if `interrupted()`."""
    try:
        child = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    except FileNotFoundError:
        if not os.path.isdir(cwd):
            return EXIT_NOT_FOUND, f"{argv[0]}: its working directory {cwd} does not exist"
        return EXIT_NOT_FOUND, f"{argv[0]}: command not found (cwd {cwd}, PATH={env.get('PATH', '')})"
    except PermissionError as exc:
        return EXIT_NOT_EXECUTABLE, f"{argv[0]}: cannot be executed ({exc})"
    except OSError as exc:
        return EXIT_NOT_EXECUTABLE, f"{argv[0]}: cannot be started ({exc})"
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def forward() -> None:
        assert child.stdout is not None
        copy = open(copy_to, "ab") if copy_to else None
        try:
            for raw in iter(lambda: child.stdout.readline(65536), b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                tail.append(line)
                log("INFO", message, line=line, **fields)
                if copy is not None:
                    copy.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    copy.flush()
        finally:
            if copy is not None:
                copy.close()

    reader = threading.Thread(target=forward, name="command-output", daemon=True)
    reader.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    while child.poll() is None:
        if interrupted():
            stop_group(child)
            reader.join(2.0)
            raise Interrupted(" ".join(argv))
        if deadline is not None and time.monotonic() >= deadline:
            stop_group(child)
            reader.join(2.0)
            tail.append(f"(stopped by the node agent after {timeout:g} s: trainer.setup_timeout_seconds)")
            return EXIT_TIMED_OUT, trim_tail(list(tail))
        time.sleep(0.1)
    reader.join(5.0)  # a background process of its own may keep the pipe open: do not wait for it
    if child.stdout is not None and not reader.is_alive():
        child.stdout.close()
    rc = child.returncode
    return (128 - rc if rc < 0 else rc), trim_tail(list(tail))


class Preparer:
    """The preparation steps of one node life, in order: fetch_workdir, find_interpreter, install_library, (the
    agent's previous-life upload), run_setup. Then `cwd`, `env` and `argv()` say how to start the trainer."""

    def __init__(self, settings: NodeSettings, node_dir: str, env: dict[str, str], *, fetcher: Fetcher,
                 library: tuple[str, str] | None = None, interrupted: Callable[[], bool] = lambda: False,
                 cache: EnvCache | None = None, image: ImageRun | None = None,
                 image_ready: Callable[[], None] = lambda: None):
        self.settings, self.node_dir, self.fetcher, self.library = settings, node_dir, fetcher, library
        # The job's image (image_run.py): the interpreter, the library, setup and the trainer are the image's.
        self.image, self.image_ready = image, image_ready
        self.cache = cache if settings.cache and settings.setup else None
        os.makedirs(node_dir, exist_ok=True)
        self.interrupted = interrupted
        self.env = dict(env)  # the trainer's environment; PATH gets the interpreter's directory
        self.python = ""  # the interpreter's executable, once found
        self.workdir: str | None = None
        self.fresh_workdir = False
        self.library_digest: str | None = None
        self._probe: dict[str, Any] | None = None
        self.cache_plan: tuple[str, list[str]] | None = None  # setup ran with a cache: (key, destinations) to upload

    @property
    def cwd(self) -> str:
        return self.workdir or self.node_dir

    def argv(self, command: list[str] | tuple[str, ...]) -> list[str]:
        return with_interpreter(command, self.python)

    def launch(self, command: list[str] | tuple[str, ...], env: dict[str, str]) -> tuple[list[str], dict | None]:
        """The trainer's command line with `env` (its final environment), and what trainer.json keeps of its
        container (None for a bare trainer). In the image: the runtime's foreground `run`, after the removal of a
        container of the same name an earlier life left."""
        argv = self.argv(command)
        if self.image is None:
            return argv, None
        self.image.clear(ROLE_TRAINER, env)
        # The run's marker (supervisor.py sets it at the start) goes in too: the agent finds the run's savers by it.
        return (self.image.wrap(argv, env, role=ROLE_TRAINER, workdir=self.workdir, also=[RUN_MARKER]),
                self.image.record())

    def helper(self, role: str) -> list[str]:
        """What goes before `INTERP -m respawn.ckpt …` of a helper (the previous-life upload, the prefetch): the
        image's container command line, nothing for a bare trainer."""
        return [] if self.image is None else self.image.prefix(self.env, role=role, workdir=self.workdir)

    # --- the interpreter ---------------------------------------------------------------------------------------

    def find_interpreter(self) -> str:
        name = self.settings.interpreter
        if self.image is not None:  # the image's, found in it when the library's probe runs
            self.python = with_interpreter([name], name)[0]
            log("INFO", "interpreter", interpreter=name, executable=self.python, image=self.image.image)
            return self.python
        self.python = resolve_interpreter(name, self.env.get("PATH", os.defpath), self.cwd)
        if "/" in name:
            directory = os.path.dirname(self.python)
            path = self.env.get("PATH", "")
            if path.split(os.pathsep)[0] != directory:
                self.env["PATH"] = directory + (os.pathsep + path if path else "")
        log("INFO", "interpreter", interpreter=name, executable=self.python)
        return self.python

    def probe(self) -> dict[str, Any]:
        """The interpreter's version and whether its environment is externally managed (PEP 668)."""
        if self._probe is None:
            argv = [self.python, "-c", _PROBE]
            if self.image is not None:
                argv = self.image.wrap(argv, self.env, role=ROLE_SETUP, workdir=self.workdir)
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=self.env)
                info = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
                out, info = None, None
                err = repr(exc)
            else:
                err = (out.stderr or out.stdout).strip()[-2000:]
            if not isinstance(info, dict):
                raise PrepareFailed(argv, f"interpreter {self.python} does not run Python: {err}; "
                                          f"{INTERPRETER_HINT}", exit_code=out.returncode if out else None)
            stdlib = info.get("stdlib") or ""
            info["externally_managed"] = (not info.get("venv")
                                          and os.path.exists(os.path.join(stdlib, "EXTERNALLY-MANAGED")))
            self._probe = info
            if info["externally_managed"] and "PIP_BREAK_SYSTEM_PACKAGES" not in self.env:
                log("WARNING", "the interpreter's environment is externally managed (PEP 668); pip may install "
                    "into it on this node (PIP_BREAK_SYSTEM_PACKAGES=1). A venv or conda interpreter avoids this: "
                    + INTERPRETER_HINT, interpreter=self.python)
        return self._probe

    def command_env(self) -> dict[str, str]:
        """The environment of the library's pip and of setup commands: the trainer's, and for an externally managed
        system interpreter (PEP 668: Debian 12+, Ubuntu 23.04+) PIP_BREAK_SYSTEM_PACKAGES=1 — this node is the
        job's alone, and pip run as root installs into /usr/local, never over the distribution's /usr/lib
        packages. A venv or conda interpreter is the cleaner choice; the trainer itself never gets the variable."""
        env = dict(self.env)
        if self.image is None and self.probe().get("externally_managed"):
            env.setdefault("PIP_BREAK_SYSTEM_PACKAGES", "1")
        return env

    # --- the workdir -------------------------------------------------------------------------------------------

    def fetch_workdir(self) -> str | None:
        uri = self.settings.workdir
        if not uri:
            return None
        try:
            self.workdir, self.fresh_workdir = ensure_workdir(uri, self.node_dir, self.fetcher,
                                                              interrupted=self.interrupted)
        except WorkdirError as exc:
            raise PrepareFailed([AGENT, "fetch-workdir", uri], str(exc)) from None
        return self.workdir

    # --- the library -------------------------------------------------------------------------------------------

    def install_library(self) -> str | None:
        """Install ATTR_LIBRARY's wheel into the interpreter's environment (--no-deps, then the wheel's `storage`
        extra for pip to complete). Once per interpreter and digest on this disk."""
        if self.library is None:
            return None
        if self.image is not None:
            return self._library_in_image()
        uri, digest = self.library
        command = [AGENT, "install-library", uri, "--interpreter", self.python]
        marker_path = os.path.join(self.node_dir, LIBRARY_MARKER)
        marker = read_json(marker_path)
        marker = marker if isinstance(marker, dict) else {}
        if marker.get(self.python) == digest:
            log("INFO", "prepare stage", stage="library_install", skipped=True, reason="already installed",
                interpreter=self.python, sha256=digest, seconds=0.0)
            self.library_digest = digest
            return digest
        version = self.probe().get("version") or [0, 0]
        if tuple(version[:2]) < LIBRARY_FLOOR:
            raise PrepareFailed(command, f"interpreter {self.python} is Python {version[0]}.{version[1]}; Respawn's "
                                         f"checkpoint library needs ≥ 3.10 — {INTERPRETER_HINT}")
        wheel = self._fetch_wheel(uri, digest, command)
        try:
            extras = storage_requirements(wheel)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise PrepareFailed(command, f"{uri} is not a readable wheel ({exc}); redeploy the control plane "
                                         "(respawn deploy) to publish the library again") from None
        started = time.monotonic()
        env = self.command_env()
        pip = [self.python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        for argv in ([*pip, "--no-deps", "--force-reinstall", wheel], [*pip, *extras] if extras else None):
            if argv is None:
                continue
            code, tail = run_logged(argv, cwd=self.node_dir, env=env, interrupted=self.interrupted,
                                    message="library install output", stage="library_install")
            if code != 0:
                hint = ("; the interpreter has no pip: install it (apt-get install python3-pip) or "
                        + INTERPRETER_HINT) if "No module named pip" in tail else ""
                raise PrepareFailed(argv, f"installing the respawn library into {self.python} failed with exit "
                                          f"code {code}{hint}", exit_code=code, output_tail=tail)
        marker[self.python] = digest
        write_json(marker_path, marker)
        log("INFO", "prepare stage", stage="library_install", interpreter=self.python, sha256=digest,
            requirements=extras, seconds=round(time.monotonic() - started, 3))
        self.library_digest = digest
        return digest

    def _library_in_image(self) -> str:
        """The image's trainer gets the library on its PYTHONPATH: the wheel unpacked in the node directory (once
        per digest), checked importable by the image's python once per image and digest (image_run.py)."""
        assert self.library is not None and self.image is not None
        uri, digest = self.library
        command = [AGENT, "install-library", uri, "--image", self.image.image]
        started = time.monotonic()
        wheel = self._fetch_wheel(uri, digest, command)
        try:
            site = unpack_wheel(wheel, os.path.join(self.node_dir, LIBRARY_DIR, digest, SITE))
        except (OSError, ValueError, zipfile.BadZipFile, LibraryError) as exc:
            raise PrepareFailed(command, f"{uri} is not a readable wheel ({exc}); redeploy the control plane "
                                         "(respawn deploy) to publish the library again") from None
        self.env["PYTHONPATH"] = library_env(site, self.settings.env)
        self.image_ready()  # the probe runs the image: the pull must be done
        marker_path = os.path.join(self.node_dir, LIBRARY_MARKER)
        marker = read_json(marker_path)
        marker = marker if isinstance(marker, dict) else {}
        key = LIBRARY_PROBE_KEY + self.image.image
        probed = marker.get(key) != digest
        if probed:
            try:
                self.image.probe_library(self.python, self.env, self.workdir, self.interrupted)
            except LibraryError as exc:
                raise PrepareFailed(command, str(exc)) from None
            marker[key] = digest
            write_json(marker_path, marker)
        log("INFO", "prepare stage", stage="library_install", image=self.image.image, sha256=digest, site=site,
            probed=probed, seconds=round(time.monotonic() - started, 3))
        self.library_digest = digest
        return digest

    def _fetch_wheel(self, uri: str, digest: str, command: list[str]) -> str:
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        if not name.endswith(".whl"):
            raise PrepareFailed(command, f"{uri} does not name a wheel (…/NAME-VERSION-py3-none-any.whl)")
        directory = os.path.join(self.node_dir, LIBRARY_DIR, digest)
        wheel = os.path.join(directory, name)  # pip needs the wheel's own file name
        if os.path.exists(wheel):
            return wheel  # renamed into place only after its digest was checked
        os.makedirs(directory, exist_ok=True)
        started = time.monotonic()
        partial = wheel + ".partial"
        try:
            size, actual = self.fetcher.fetch(uri, partial, interrupted=self.interrupted,
                                              missing_hint="the respawn wheel is gone; redeploy the control plane "
                                                           "(respawn deploy), which publishes it again")
            if actual != digest:
                raise PrepareFailed(command, f"respawn wheel {uri} does not match its digest: expected sha256 "
                                             f"{digest}, got {actual}; redeploy the control plane (respawn deploy)")
            os.replace(partial, wheel)
        except FetchError as exc:
            raise PrepareFailed(command, f"cannot download the respawn library: {exc}") from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        log("INFO", "prepare stage", stage="library_download", uri=uri, bytes=size,
            seconds=round(time.monotonic() - started, 3))
        return wheel

    # --- setup -------------------------------------------------------------------------------------------------

    def setup_inputs(self) -> dict[str, Any]:
        workdir = self.settings.workdir
        return {"workdir": contract.workdir_digest(workdir) if workdir else None,
                "setup": [list(c) for c in self.settings.setup],
                "interpreter": [self.settings.interpreter, self.python], "library": self.library_digest,
                **({"image": self.image.image} if self.image is not None else {})}

    def _cache_plan(self) -> tuple[str, list[str]] | None:
        """The environment cache's key and where each cache path lands; None (logged) when a path has no place."""
        s = self.settings
        try:
            dests = destinations(s.cache, self.cwd, self.env.get("HOME"))
        except CacheError as exc:
            log("WARNING", "environment cache off for this node; setup runs", error=str(exc))
            return None
        inputs = key_inputs(setup=[list(c) for c in s.setup], env=s.env, interpreter=s.interpreter,
                            workdir=contract.workdir_digest(s.workdir) if s.workdir else None,
                            executable=self.python, version=self.probe().get("version") or [],
                            library=self.library_digest, paths=s.cache, dests=dests, system=os_identity())
        return cache_key(inputs), dests

    def run_setup(self) -> bool:
        """Run each setup command; False when skipped (same inputs as the last success on this disk) or restored
        from the environment cache. True when the commands ran: `cache_plan` then says what to upload."""
        if not self.settings.setup:
            return False
        marker = os.path.join(self.node_dir, SETUP_DONE)
        inputs = self.setup_inputs()
        if read_json(marker) == inputs and not self.fresh_workdir:
            log("INFO", "prepare stage", stage="setup", skipped=True, reason="unchanged since it last succeeded",
                commands=len(self.settings.setup), seconds=0.0)
            return False
        try:
            os.unlink(marker)  # until this run succeeds
        except FileNotFoundError:
            pass
        plan = self._cache_plan() if self.cache is not None else None
        if plan is not None and self.cache is not None and self.cache.restore(*plan):
            write_json(marker, inputs)
            log("INFO", "prepare stage", stage="setup", skipped=True, reason="restored from the environment cache",
                commands=len(self.settings.setup), seconds=0.0)
            return False
        env = self.command_env()
        started = time.monotonic()
        for index, command in enumerate(self.settings.setup):
            argv = self.argv(command)
            run = argv if self.image is None else self.image.wrap(argv, env, role=ROLE_SETUP, workdir=self.workdir)
            began = time.monotonic()
            log("INFO", "setup command starting", index=index, argv=argv, cwd=self.cwd)
            timeout = self.settings.setup_timeout_seconds
            code: int | None = None
            try:
                code, tail = run_logged(run, cwd=self.cwd, env=env, interrupted=self.interrupted,
                                        message="setup output", timeout=timeout, index=index,
                                        copy_to=os.path.join(self.node_dir, SETUP_LOG))
            finally:
                if self.image is not None and (self.interrupted() or code != 0):
                    self.image.clear(ROLE_SETUP, env)  # stopped early: its container must not go on
            log("INFO" if code == 0 else "ERROR", "prepare stage", stage="setup_command", index=index, argv=argv,
                exit_code=code, seconds=round(time.monotonic() - began, 3))
            if code != 0:
                how = (f"did not finish within {timeout:g} s (trainer.setup_timeout_seconds)"
                       if code == EXIT_TIMED_OUT else f"failed with exit code {code}")
                raise PrepareFailed(argv, f"setup command {index + 1} of {len(self.settings.setup)} {how}: "
                                          f"{' '.join(argv)}", exit_code=code, output_tail=tail)
        write_json(marker, inputs)
        self.cache_plan = plan
        log("INFO", "prepare stage", stage="setup", commands=len(self.settings.setup),
            seconds=round(time.monotonic() - started, 3))
        return True
