"""Runs a launcher (torchrun, a shell script, ...) and exits 75 when its job stopped on a preemption notice with its
emergency checkpoint committed.

    python -m respawn.ckpt.launch torchrun --standalone --nproc-per-node 8 train.py ...

Why: torchrun never exits 75: when its workers exit 75 it exits 1, which the node agent would read as a crash. The
launcher runs in a session of its own; SIGTERM or SIGINT to this process, whether to its pid alone (`kill PID`,
`docker stop`, systemd, a scheduler) or to its whole process group (Ctrl-C in a terminal), is the notice: the first
one is delivered, once, to the run's processes that save (contract.deliver_notice: each registered respawn.ckpt
process, never its loader workers, its shells or torchrun, which would die of it or pass it on to every rank's
process group), or, when none has registered yet, as SIGTERM to the launcher's process group; later ones are noted
only. Under the node agent the agent delivers the notice to the same processes itself. After the launcher exits, 0
stays 0; any other status becomes 75 when the node's status file (RESPAWN_STATUS_FILE; run by hand, a private one in
a temporary directory) shows that the emergency save of this run committed, and 76 (contract.EXIT_NOTICE_UNSAVED)
when it failed, was abandoned or never began after a notice; otherwise the status passes through (a signal N as
128+N). In full: docs/checkpoint.md ("What the notice does to a process tree", the exit codes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from respawn import contract

from . import _log

NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def notice_exit(status: dict | None, since: float, noticed: bool) -> int | None:
    """The exit code of a run that stopped on a notice (75 or 76), from a status file written after `since`
    (time.time()); None when it did not stop on one (`noticed`: a notice was delivered to this run)."""
    fresh = status if status and isinstance(status.get("updated_at"), (int, float)) and \
        status["updated_at"] >= since else None  # not one left by an earlier run
    emergency = (fresh or {}).get("emergency")
    state = emergency.get("state") if isinstance(emergency, dict) else None
    if state in contract.EMERGENCY_ENDED:
        return contract.exit_on_notice(state == "committed")
    return contract.EXIT_NOTICE_UNSAVED if noticed else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m respawn.ckpt.launch LAUNCHER [ARGS...]  (e.g. torchrun --nproc-per-node 8 "
              "train.py)", file=sys.stderr)
        return 2
    status_path, notice_dir = os.environ.get(contract.ENV_STATUS_FILE), os.environ.get(contract.ENV_NOTICE_DIR)
    private = None
    if not status_path or not notice_dir:  # outside the node agent: files of our own tell a notice's exit
        private = tempfile.mkdtemp(prefix="respawn-launch-")
        status_path = status_path or os.path.join(private, contract.STATUS_FILE)
        notice_dir = notice_dir or os.path.join(private, contract.NOTICE_DIR)
    env = {**os.environ, contract.ENV_STATUS_FILE: status_path, contract.ENV_NOTICE_DIR: notice_dir}
    try:
        return _run(argv, status_path, notice_dir, env)
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


class _Notice:
    """The signals this process got, and the one notice it delivers to the run."""

    def __init__(self, notice_dir: str) -> None:
        self.notice_dir = notice_dir
        self.child: subprocess.Popen | None = None
        self.signals: list[str] = []
        self.sent = False

    def on_signal(self, signum, _frame) -> None:  # Python runs it in the main thread, between bytecodes
        self.signals.append(signal.Signals(signum).name)
        self.send()

    def send(self) -> None:
        child = self.child
        if self.sent or not self.signals or child is None or child.returncode is not None:
            return  # once; a signal before the launcher started is sent as soon as it has
        self.sent = True
        savers = contract.deliver_notice(self.notice_dir, lambda pid: True)  # the directory is this run's alone
        if savers:
            _log.warning("notice: SIGTERM sent to the processes that save; waiting for the emergency checkpoint",
                         signal=self.signals[0], pids=savers)
            return
        try:
            os.killpg(child.pid, signal.SIGTERM)  # its group is its pid: start_new_session
        except ProcessLookupError:  # it exited meanwhile
            return
        _log.warning("notice: no process of the run saves yet; SIGTERM sent to the launcher's process group",
                     signal=self.signals[0], launcher_pid=child.pid)


def _run(argv: list[str], status_path: str, notice_dir: str, env: dict) -> int:
    notice = _Notice(notice_dir)
    for sig in NOTICE_SIGNALS:
        signal.signal(sig, notice.on_signal)
    started = time.time()
    try:
        # A session of its own: no group signal aimed at this process (the terminal's Ctrl-C) reaches the run beside
        # the notice this process delivers, so a signal to this pid and one to its group act alike and no process
        # of the run gets the notice twice (torchrun's handler would abort its own shutdown on a second one).
        child = subprocess.Popen(argv, env=env, start_new_session=True)
    except OSError as exc:
        _log.error("cannot start the launcher", argv=argv, error=str(exc))
        return 127
    notice.child = child  # Popen returned: the launcher has exec'd in its new session
    notice.send()
    code = child.wait()
    code = 128 - code if code < 0 else code
    if code == 0:
        return 0
    status = contract.read_status(status_path)
    stopped = notice_exit(status, started, notice.sent or contract.notice_marked(notice_dir))
    if stopped is None:
        return code
    emergency = (status or {}).get("emergency")
    (_log.info if stopped == contract.EXIT_PREEMPTED else _log.error)(
        f"the job stopped on a preemption notice; exiting {stopped}", launcher_exit=code, emergency=emergency,
        signals=notice.signals)
    return stopped


if __name__ == "__main__":
    sys.exit(main())
