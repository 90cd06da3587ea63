"""A loss in words, one way for every page (pure): the last line of a failed trainer's error, and the sentence that
says how a noticed node's emergency save ended. The control plane records `last_error` and `emergency` on the loss
(respawn.schema._Loss, the loss event's details) and Slack's alerts say them (respawn.control.alerts); the summary,
`jobs describe`, the events and the report call the same two functions, so a user reads one wording everywhere.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

LAST_ERROR_CHARS = 500  # one line, as Slack and a table cell show it

# "ValueError: bad learning rate", "torch.OutOfMemoryError: CUDA out of memory…", a bare "AssertionError": an
# exception's type (dotted, named as Python's built-in ones are) and its message. Not "Traceback (most recent…)".
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)(?::\s.*|:)?$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# torchrun's prefix on a rank's own lines ("[rank2]: ValueError: …"), and its own exception once any rank failed: it
# says that a rank failed, never why, so a rank's error comes first.
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s*")
_LAUNCHER = re.compile(r"^(?:[\w.]*\.)?ChildFailedError\b")
# A rank's error when a peer's collective broke under it (the peer crashed or went away): gloo's "Connection closed
# by peer", "… reset by peer", NCCL's aborted communicator or its watchdog. Not the error that started the failure.
_BROKEN_COLLECTIVE = re.compile(r"Connection (?:closed|reset) by peer|NCCL communicator was aborted|"
                                r"ProcessGroupNCCL's watchdog|DistNetworkError|DistBackendError")

# The emergency save's states (respawn.contract.EMERGENCY_STATES, and "not-started": noticed, no save begun).
FINAL = ("committed", "failed", "abandoned", "not-started")  # the save is over: nothing more will be said of it
_RANK = re.compile(r"^rank (\d+):\s*(.*)$", re.S)


def last_error(output_tail: str | None) -> str | None:
    """The trainer's error in one line, from the end of its output: the last line that looks like an exception
    (`SomeError: message`; under torchrun a rank's own before the launcher's ChildFailedError), else the last
    non-empty line; None without output."""
    if not output_tail:
        return None
    lines = [_RANK_PREFIX.sub("", line.strip()) for line in _ANSI.sub("", output_tail).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return None
    errors = [x for x in lines if _EXCEPTION.match(x)]
    own = [x for x in errors if not _LAUNCHER.match(x)]
    line = (own or errors or lines)[-1]
    return line[:LAST_ERROR_CHARS]


def broken_collective(output_tail: str | None) -> bool:
    """Whether a failed trainer's error (last_error) is a collective that broke under it: a peer's failure, not its
    own. A member whose error is its own is the one to name when several fail together."""
    error = last_error(output_tail)
    return error is not None and bool(_BROKEN_COLLECTIVE.search(error))


def emergency_sentence(emergency: Mapping[str, Any] | None, resumed_from: int | None = None,
                       steps_lost: int | None = None) -> str | None:
    """'emergency save failed on rank 1: RuntimeError: DataLoader worker (pid 7883) is killed by signal:
    Terminated — resumed from step 216, 19 steps lost': how a noticed node's emergency save ended (`emergency`,
    the loss record's), then what the recovery resumed from and lost when known. None without a save to tell of
    (no notice, or a record without one)."""
    if not isinstance(emergency, Mapping):
        return None
    state, step = emergency.get("state"), emergency.get("step")
    reason = str(emergency.get("reason") or "").strip().rstrip(".")
    rank = _RANK.match(reason)
    where, why = (f" on rank {rank.group(1)}", rank.group(2).strip()) if rank else ("", reason)
    if state == "committed":
        head = "emergency save committed" + (f" step {step}" if step is not None else "")
    elif state in ("failed", "abandoned"):
        head = f"emergency save {state}{where}" + (f": {why}" if why else "")
    elif state in ("not-started", "idle"):  # idle in a final word: the trainer never began one
        head = f"emergency save not started{where}: {why}" if why else "emergency save not started"
    elif state == "saving":  # the node's last word: still saving when it went
        head = f"emergency save did not finish{where}" + (f": {why}" if why else " before the node went")
    else:
        return None
    said = [f"resumed from step {resumed_from}"] if resumed_from is not None else []
    if steps_lost is not None:
        said.append(f"{steps_lost} step{'' if steps_lost == 1 else 's'} lost")
    return head + (" — " + ", ".join(said) if said else "")


def event_words(details: Mapping[str, Any]) -> str | None:
    """What a loss event's record says of a bad day, once, in words: an emergency save that did not commit, and the
    trainer's last error (the live view's event lines and `jobs events`). A save's outcome told after its loss was
    recorded (a `save_outcome` event's `told_late`) is said however it ended, and says so."""
    emergency, late = details.get("emergency"), details.get("told_late") is True
    saved = emergency_sentence(emergency) if isinstance(emergency, Mapping) and (
        late or emergency.get("state") != "committed") else None
    said = [saved + " (told after its loss was recorded)" if saved and late else saved, details.get("last_error")]
    return "; ".join(str(s) for s in said if s) or None
