"""Runs a launcher (torchrun, ...) and exits 75 when its job stopped on a preemption notice.

    python -m respawn.ckpt.launch torchrun --standalone --nproc-per-node 8 train.py ...

Why: torchrun never exits 75: on SIGTERM, and when its workers all exit 75, it exits 1, which the node agent would
read as a crash. The launcher runs in a session of its own; SIGTERM or SIGINT to this process, whether to its pid
alone (`kill PID`, `docker stop`, systemd, a scheduler) or to its whole process group (the node agent, Ctrl-C in a
terminal), is the notice: the first one is sent on as SIGTERM to the launcher's process group (torchrun forwards it
to its workers), once; later ones are noted only, so that no process of the run gets the notice twice. After the
launcher exits, 0 stays 0; any other status becomes 75 when the node's status file (RESPAWN_STATUS_FILE; run by
hand, a private one in a temporary directory) shows that an emergency save ended during this run (every rank then
stopped on the notice); otherwise the status passes through (a signal N as 128+N). In full: docs/checkpoint.md
("Multi-rank jobs (torchrun, DDP)", the exit code).
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

_ENDED = ("committed", "abandoned", "failed")
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stopped_on_notice(status: dict | None, since: float) -> bool:
    """Whether a status file written after `since` (time.time()) records an emergency save that ended."""
    if not status or not isinstance(status.get("updated_at"), (int, float)) or status["updated_at"] < since:
        return False  # none, or one left by an earlier run
    emergency = status.get("emergency")
    return isinstance(emergency, dict) and emergency.get("state") in _ENDED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m respawn.ckpt.launch LAUNCHER [ARGS...]  (e.g. torchrun --nproc-per-node 8 "
              "train.py)", file=sys.stderr)
        return 2
    status_path, private = os.environ.get(contract.ENV_STATUS_FILE), None
    env = None
    if not status_path:  # outside the node agent: a status file of our own tells a notice's exit from a crash
        private = tempfile.mkdtemp(prefix="respawn-launch-")
        status_path = os.path.join(private, contract.STATUS_FILE)
        env = {**os.environ, contract.ENV_STATUS_FILE: status_path}
    try:
        return _run(argv, status_path, env)
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


class _Notice:
    """The signals this process got, and the one SIGTERM it sends on to the launcher's process group."""

    def __init__(self) -> None:
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
        try:
            os.killpg(child.pid, signal.SIGTERM)  # its group is its pid: start_new_session
        except ProcessLookupError:  # it exited meanwhile
            return
        _log.warning("notice: SIGTERM sent to the launcher's process group; waiting for the emergency checkpoint",
                     signal=self.signals[0], launcher_pid=child.pid)


def _run(argv: list[str], status_path: str, env: dict | None) -> int:
    notice = _Notice()
    for sig in NOTICE_SIGNALS:
        signal.signal(sig, notice.on_signal)
    started = time.time()
    try:
        # A session of its own: no group signal aimed at this process (the agent's, the terminal's Ctrl-C) reaches
        # the run beside the one this process sends, so a signal to this pid and one to its group act alike and
        # the run never gets the notice twice (torchrun's handler would abort its own shutdown on a second one).
        child = subprocess.Popen(argv, env=env, start_new_session=True)
    except OSError as exc:
        _log.error("cannot start the launcher", argv=argv, error=str(exc))
        return 127
    notice.child = child  # Popen returned: the launcher has exec'd in its new session
    notice.send()
    code = child.wait()
    code = 128 - code if code < 0 else code
    if code != 0:
        status = contract.read_status(status_path)
        if stopped_on_notice(status, started):
            _log.info("the job stopped on a preemption notice; exiting 75", launcher_exit=code,
                      emergency=status["emergency"], signals=notice.signals)
            return contract.EXIT_PREEMPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
