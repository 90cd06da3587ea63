"""The trainer process: start it, find it again after an agent restart, signal it, learn how it ended.

The trainer runs in its own process group under a tiny /bin/sh wrapper that records its exit status in
`trainer.exit`. Its output goes straight to `trainer.log` in the node directory (never through a pipe to the
agent), so the trainer does not depend on the agent: an agent that crashes or is restarted leaves the trainer
running, and the next agent adopts it (pid, start time and boot id in `trainer.json` rule out a recycled pid) and
still learns its exit status from `trainer.exit`. The agent forwards new lines of trainer.log to its own stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from respawn import contract
from respawn.logs import log

from .container import Runtime, remove

RECORD = "trainer.json"
EXIT_FILE = "trainer.exit"
LOG_FILE = "trainer.log"
TAIL_LINES = 50
TAIL_BYTES = 4096

# sh traps TERM/INT/HUP with a no-op so it outlives the trainer to record the status; a trapped (not ignored)
# signal is reset to its default in the exec'd trainer, which therefore gets the notice as usual.
_WRAPPER = (
    'f=$1; shift; trap : TERM INT HUP; "$@"; rc=$?; '
    'printf "%s\\n" "$rc" > "$f.tmp" && mv -f "$f.tmp" "$f"; exit $rc'
)


def boot_id() -> str:
    """The kernel's boot id. RESPAWN_BOOT_ID overrides it so a simulated node can have a new "boot" on each start."""
    if os.environ.get("RESPAWN_BOOT_ID"):
        return os.environ["RESPAWN_BOOT_ID"]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


# In the environment of every process of one trainer run (its value: the run's started_at), inherited by whatever the
# trainer starts, in any session: kill() finds them by it even after their parents have gone (reparented).
RUN_MARKER = "RESPAWN_TRAINER_RUN"


def processes_with(marker: bytes) -> list[int]:
    """Every live process whose environment holds `marker` (NAME=VALUE); a zombie's environment is empty."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:  # gone, or not ours to read
                continue
    return found


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (its children, theirs, ...), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def normalize_exit(returncode: int) -> int:
    """Popen's -N (killed by signal N) as the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class TrainerRecord:
    """trainer.json: the trainer this node started, kept across agent restarts and reboots (the node's disk)."""

    pid: int  # the wrapper's pid = the trainer's process group id
    start_time: str | None
    boot_id: str
    job_id: str
    attempt: int
    log_offset: int  # where this run's output starts in trainer.log
    started_at: str  # ISO 8601 UTC
    notice: str | None = None  # set when an agent handled a notice for this run
    generation: int | None = None  # a multi-node member: the generation this run trains in
    members: list[str] | None = None  # and that generation's members
    # The job's image: the trainer's container ({"name", "runtime", "exe"}, image_run.ImageRun.record), removed by
    # name after the deadline's kill; None for a bare trainer.
    container: dict | None = None

    def save(self, node_dir: str) -> None:
        path = os.path.join(node_dir, RECORD)
        with open(path + ".tmp", "w") as f:
            json.dump(asdict(self), f)
        os.replace(path + ".tmp", path)

    @staticmethod
    def load(node_dir: str) -> TrainerRecord | None:
        try:
            with open(os.path.join(node_dir, RECORD)) as f:
                return TrainerRecord(**json.load(f))
        except (OSError, ValueError, TypeError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log("WARNING", "ignoring an unreadable trainer record", path=os.path.join(node_dir, RECORD),
                    error=str(exc))
            return None

    @staticmethod
    def clear(node_dir: str) -> None:
        """Keep the last record for people (trainer.last.json) and forget it for the agent."""
        path = os.path.join(node_dir, RECORD)
        try:
            os.replace(path, os.path.join(node_dir, "trainer.last.json"))
        except FileNotFoundError:
            pass

    def alive(self) -> bool:
        return self.boot_id == boot_id() and contract.process_start_time(self.pid) == self.start_time


def finished_anyway(code: int | None, status: dict | None) -> int | None:
    """0 for a trainer whose status file says it committed its last step (committed_step == total_steps) but that
    then exited with another status (an abort in its interpreter's teardown, the launcher's status after it): the
    job is finished, not failed, and one WARNING line says so. Any other exit as it is."""
    if code in (0, *contract.EXITS_ON_NOTICE) or not status:
        return code
    total, committed = status.get("total_steps"), status.get("committed_step")
    if not isinstance(total, int) or isinstance(total, bool) or committed != total:
        return code
    log("WARNING", "the trainer committed its last step and then exited with an error; the job is finished",
        exit_code=code, committed_step=committed, total_steps=total)
    return 0


def read_exit_file(node_dir: str) -> int | None:
    try:
        with open(os.path.join(node_dir, EXIT_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class TrainerProcess:
    """A running (or finished) trainer: either our child, or adopted from a previous agent."""

    def __init__(self, node_dir: str, record: TrainerRecord, child: subprocess.Popen | None):
        self.node_dir, self.record, self.child = node_dir, record, child
        self._exit: int | None = None
        self._done = False

    @property
    def pid(self) -> int:
        return self.record.pid

    @classmethod
    def start(cls, node_dir: str, argv: list[str], env: dict[str, str], *, job_id: str, attempt: int,
              started_at: str, cwd: str | None = None, generation: int | None = None,
              members: list[str] | None = None, container: dict | None = None) -> TrainerProcess:
        for stale in (EXIT_FILE, contract.STATUS_FILE):
            try:
                os.unlink(os.path.join(node_dir, stale))  # the previous run's outcome must not read as this one's
            except FileNotFoundError:
                pass
        shutil.rmtree(os.path.join(node_dir, contract.NOTICE_DIR), ignore_errors=True)  # its savers and its mark
        log_path = os.path.join(node_dir, LOG_FILE)
        with open(log_path, "ab") as out:
            offset = out.tell()
            child = subprocess.Popen(
                ["/bin/sh", "-c", _WRAPPER, "respawn-trainer", os.path.join(node_dir, EXIT_FILE), *argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env={**env, RUN_MARKER: started_at},
                cwd=cwd or node_dir,
                # setsid(): a session and process group of its own, led by the wrapper (pgid = its pid), so that
                # signal() reaches the wrapper and the trainer together and nothing aimed at the agent's group
                # does. (Not Popen's process_group=0: that is Python 3.11+, and nodes run 3.9 and 3.10 too.)
                start_new_session=True,
            )
        record = TrainerRecord(pid=child.pid, start_time=contract.process_start_time(child.pid), boot_id=boot_id(),
                               job_id=job_id, attempt=attempt, log_offset=offset, started_at=started_at,
                               generation=generation, members=members, container=container)
        record.save(node_dir)
        log("INFO", "trainer started", pid=child.pid, argv=argv, cwd=cwd or node_dir, log=log_path,
            started_at=started_at, generation=generation,
            **({"container": container.get("name"), "runtime": container.get("runtime")} if container else {}))
        return cls(node_dir, record, child)

    def poll(self) -> tuple[bool, int | None]:
        """(ended, exit status). The status is None when an adopted trainer's wrapper left none (it was killed)."""
        if self._done:
            return True, self._exit
        if self.child is not None:
            rc = self.child.poll()
            if rc is None:
                return False, None
            self._exit = normalize_exit(rc)
        else:
            if self.record.alive():
                return False, None
            self._exit = read_exit_file(self.node_dir)
        self._exit = finished_anyway(self._exit, contract.read_status(os.path.join(self.node_dir, contract.STATUS_FILE)))
        self._done = True
        return True, self._exit

    def owns(self, pid: object) -> bool:
        """Whether `pid` is a live process of this trainer's run (e.g. its status file's writer): in its process
        group, or in a session of its own with the run's marker (under respawn.ckpt.launch); a signal meant for one
        of its processes must never reach a recycled pid."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or contract.process_start_time(pid) is None:
            return False
        try:
            if os.getpgid(pid) == self.pid:
                return True
        except OSError:
            return False
        return pid in processes_with(f"{RUN_MARKER}={self.record.started_at}".encode())

    def notify(self) -> list[int]:
        """The notice: SIGTERM to the run's savers (contract.deliver_notice), never to its loader workers, shells
        or launchers; to its process group when no process of the run saves (nothing of it could be lost). The
        savers signalled; none for the group."""
        savers = contract.deliver_notice(os.path.join(self.node_dir, contract.NOTICE_DIR), self.owns)
        if savers:
            log("INFO", "notice: SIGTERM sent to the processes that save", pids=savers)
        else:
            log("INFO", "notice: no process of the run saves (none registered); SIGTERM to its process group",
                pgid=self.pid)
            self.signal(signal.SIGTERM)
        return savers

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:  # a recycled pgid owned by someone else: never signal it
            log("ERROR", "cannot signal the trainer's process group", pgid=self.pid, error=str(exc))

    def kill(self) -> None:
        """SIGKILL to the trainer's process group and to every process of its run: a launcher puts its workers in
        sessions of their own (torchrun does), where the group's signal does not reach them, and a worker blocked in
        a collective would outlive its launcher (holding its memory, its device, its ports). They are found by
        descent and by the run's marker in their environment (a launcher that exited first left its workers
        reparented), and looked for again after the kill (one may have forked meanwhile)."""
        marker = f"{RUN_MARKER}={self.record.started_at}".encode()
        others = set(_descendants(self.pid)) | set(processes_with(marker))  # before the kill: then they are reparented
        self.signal(signal.SIGKILL)
        for _ in range(3):
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except PermissionError as exc:
                    log("ERROR", "cannot kill a process the trainer started", pid=pid, error=str(exc))
            others = set(processes_with(marker)) - others
            if not others:
                break
        self.remove_container()

    def remove_container(self) -> None:
        """The trainer's container, if it has one, removed by name (its processes were killed above; the runtime's
        record of it, and its conmon or shim, go now), and checked gone."""
        found = self.record.container
        if not found:
            return
        if remove(Runtime(str(found.get("runtime")), str(found.get("exe"))), str(found.get("name"))):
            log("INFO", "the trainer's container removed", container=found.get("name"))

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll()[0]:
                return True
            time.sleep(0.05)
        return self.poll()[0]

    def output_tail(self) -> str:
        return log_tail(os.path.join(self.node_dir, LOG_FILE), self.record.log_offset)


def log_tail(path: str, start: int = 0, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last `lines` lines (and at most `max_bytes` bytes) of `path` after offset `start`."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            begin = max(start, size - 64 * 1024)
            f.seek(begin)
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if begin > start:
        text = text.split("\n", 1)[-1]  # drop a partial first line
    tail = "\n".join(text.rstrip("\n").split("\n")[-lines:])
    encoded = tail.encode("utf-8")
    if len(encoded) > max_bytes:
        tail = encoded[-max_bytes:].decode("utf-8", errors="ignore")
    return tail


class OutputForwarder(threading.Thread):
    """Copies new complete lines of trainer.log (from `offset`) to the agent's stdout, so `journalctl -u
    respawn-agent` and the local demo show the trainer's output too."""

    def __init__(self, path: str, offset: int, *, interval: float = 0.5, stream: Any = None):
        super().__init__(name="forward-trainer-output", daemon=True)
        self.path, self.offset, self.interval = path, offset, interval
        # The process's real stdout: not main's tee, so trainer output is not copied into agent.log as well.
        self.stream = stream or sys.__stdout__
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while True:
            stopping = self._halt.wait(self.interval)
            self.pump(final=stopping)
            if stopping:
                return

    def pump(self, final: bool = False) -> None:
        try:
            size = os.path.getsize(self.path)
            if size <= self.offset:
                return
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(size - self.offset, 1 << 20))
        except OSError:
            return
        end = data.rfind(b"\n") + 1 if not final else len(data)
        if end <= 0:
            return
        self.offset += end
        try:
            self.stream.write(data[:end].decode("utf-8", errors="replace"))
            self.stream.flush()
        except (OSError, ValueError):
            pass
