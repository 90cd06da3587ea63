"""`systemctl` for a simulated node, so that a sim node can boot the real deploy/vm/startup.sh.

The startup script runs `$SYSTEMCTL daemon-reload`, `is-active --quiet UNIT`, `kill --kill-who=main
--signal=SIGHUP UNIT` and `enable --now UNIT`. With SYSTEMCTL set to `command()` (this file run by the sim's
interpreter), those do on a sim node what systemd does on a VM, as far as the agent can tell:

- `enable --now UNIT` / `start UNIT`: reads $SYSTEMD_UNIT_DIR/UNIT and *becomes* its ExecStart (exec, in the
  foreground): the startup script is the node's boot command, so the sim's power-off SIGTERM to the node's
  process group reaches the agent, as systemd's KillSignal does. Paths under /opt/respawn are mapped to
  $RESPAWN_ROOT and /var/lib/respawn to $RESPAWN_NODE_DIR; the unit's Environment= entries are added where the
  caller's environment (RESPAWN_NODE_DIR, GCE_METADATA_HOST, FIRESTORE_EMULATOR_HOST, ...) has none. A unit that
  is already active is left alone (exit 0), as systemd does.
- `is-active [--quiet] UNIT`: 0 while that process is alive (same pid and start time), else 3.
- `kill [--kill-who=main] [--signal=SIG] UNIT`: the signal to that process.
- `daemon-reload`, `enable UNIT` (without --now): check the unit file exists, nothing else.

No Restart=: a sim node that loses its agent stays without one until it is rebooted (the sim's node lifecycle
stands in for it). Standard library only, and run as a script: the node's cwd is its own directory.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

# Unit paths that live elsewhere on a sim node: (prefix in the unit, environment variable naming its stand-in).
PATH_MAP = (("/opt/respawn", "RESPAWN_ROOT"), ("/var/lib/respawn", "RESPAWN_NODE_DIR"))
INACTIVE = 3  # systemctl is-active's status for an inactive unit
USAGE = "verbs: daemon-reload, enable [--now] UNIT, start UNIT, is-active [--quiet] UNIT, kill [--signal=SIG] UNIT"


def command() -> str:
    """The SYSTEMCTL value for a sim node's environment (the startup script splits it into words)."""
    words = (sys.executable, str(Path(__file__).resolve()))
    if any(c.isspace() for w in words for c in w):
        raise ValueError(f"{words}: the startup script splits SYSTEMCTL on spaces; use paths without them")
    return " ".join(words)


def _say(severity: str, message: str, **fields: object) -> None:
    print(json.dumps({"severity": severity, "message": f"sim systemctl: {message}", **fields}), file=sys.stderr,
          flush=True)


class UnitError(Exception):
    pass


def unit_path(unit: str) -> Path:
    return Path(os.environ.get("SYSTEMD_UNIT_DIR") or "/etc/systemd/system") / unit


def read_unit(unit: str) -> dict[str, list[str]]:
    """{"Section.Key": [values]} of the unit file (repeated keys such as Environment= keep their order)."""
    path = unit_path(unit)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UnitError(f"unit {unit} not found at {path} ({exc.strerror}); the startup script writes it first "
                        "(set SYSTEMD_UNIT_DIR to where it wrote it)") from None
    entries: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return entries


def map_path(word: str, env: dict[str, str]) -> str:
    for prefix, variable in PATH_MAP:
        if env.get(variable) and (word == prefix or word.startswith(prefix + "/")):
            return env[variable] + word[len(prefix):]
    return word


def _state_file(unit: str) -> Path:
    return unit_path(unit).with_name(f".{unit}.main")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


def main_pid(unit: str) -> int | None:
    """The pid of the unit's running main process, or None."""
    try:
        pid, started = _state_file(unit).read_text().split()
    except (OSError, ValueError):
        return None
    return int(pid) if _start_time(int(pid)) == started else None


def _default_signals() -> None:
    """What systemd starts a service with: every signal at its default but SIGPIPE, ignored (IgnoreSIGPIPE=yes).
    An ignored signal survives exec, so without this a caller's (nohup's SIGHUP) would reach the unit's process."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_IGN if sig == signal.SIGPIPE else signal.SIG_DFL)
        except (OSError, ValueError):  # the C library's own real-time signals
            pass


def start(unit: str) -> int:
    """exec the unit's ExecStart; returns only if the unit is already active or cannot start."""
    if main_pid(unit) is not None:
        return 0
    entries = read_unit(unit)
    exec_start = entries.get("Service.ExecStart")
    if not exec_start:
        raise UnitError(f"unit {unit} at {unit_path(unit)} has no ExecStart")
    env = dict(os.environ)
    argv = [map_path(w, env) for w in shlex.split(exec_start[-1])]
    for item in entries.get("Service.Environment", []):
        for assignment in shlex.split(item):
            key, _, value = assignment.partition("=")
            env.setdefault(key, value)  # the caller's environment wins: it is the sim node's
    workdir = map_path(entries.get("Service.WorkingDirectory", [os.getcwd()])[-1], env)
    os.makedirs(workdir, exist_ok=True)  # StateDirectory= creates it on a VM
    os.chdir(workdir)
    # exec keeps the pid and the start time: is-active and kill find the agent by them.
    _state_file(unit).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    _say("INFO", f"starting {unit}", argv=argv, cwd=workdir)
    _default_signals()
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        _state_file(unit).unlink(missing_ok=True)
        raise UnitError(f"cannot run {unit}'s ExecStart {argv}: {exc.strerror}; check that the startup script "
                        "installed it (RESPAWN_ROOT)") from None


def _signal(name: str) -> int:
    name = name.upper()
    if name.isdigit():
        return int(name)
    try:
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        raise UnitError(f"unknown signal {name!r}; use a name such as SIGHUP") from None


def run(args: list[str]) -> int:
    flags = [a for a in args if a.startswith("-")]
    words = [a for a in args if not a.startswith("-")]
    if not words:
        raise UnitError(f"no verb given; {USAGE}")
    verb, units = words[0], words[1:]
    if verb == "daemon-reload":
        return 0
    if not units:
        raise UnitError(f"{verb} needs a unit name")
    unit = units[0]
    if verb == "is-active":
        active = main_pid(unit) is not None
        if "--quiet" not in flags and "-q" not in flags:
            print("active" if active else "inactive")
        return 0 if active else INACTIVE
    if verb == "enable" and "--now" not in flags:
        read_unit(unit)
        return 0
    if verb in ("enable", "start"):
        return start(unit)
    if verb == "kill":
        sig = next((f.split("=", 1)[1] for f in flags if f.startswith(("--signal=", "-s="))), "SIGTERM")
        pid = main_pid(unit)
        if pid is None:
            raise UnitError(f"{unit} is not active: no main process to signal")
        os.kill(pid, _signal(sig))
        return 0
    raise UnitError(f"verb {verb!r} is not supported on a sim node; {USAGE}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        return run(args)
    except UnitError as exc:
        _say("ERROR", str(exc), args=args)
        return 1


if __name__ == "__main__":
    sys.exit(main())
