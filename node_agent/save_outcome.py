"""What the node says of its emergency save after a notice: the run's outcome (the status file's, written by the
node's first rank) and each saver's own (contract.Saver, in the run's notice directory), in words a person reads.
A saver that never recorded an outcome did not start its save (it ended first, or was killed at the deadline); a
run with no saver at all had nothing that could save. Pure: the agent passes what it read.
"""

from __future__ import annotations

from typing import Any

from respawn import contract


def _unstarted_reason(exit_code: int | None, killed: bool) -> str:
    if killed:
        return "killed at the notice deadline before it reached a step boundary"
    return "the run ended before this process began its save" + ("" if exit_code is None else
                                                                  f" (the trainer exited {exit_code})")


def _cut_short(exit_code: int | None, killed: bool, step: Any) -> str:
    how = "killed at the notice deadline" if killed else f"the trainer exited {exit_code}"
    return f"{how} while saving step {step}"


def rank_outcomes(savers: list[contract.Saver], run: dict[str, Any], writer: Any, *, ended: bool,
                  exit_code: int | None, killed: bool) -> list[dict[str, Any]]:
    """Each saver's outcome: its own record; or, the run over, cut short while saving (the status file's writer,
    `writer`, said `saving`: `run`) or not started; or, still running, saving."""
    out = []
    for saver in savers:
        own, step = saver.outcome or {}, None
        if own.get("state") in contract.EMERGENCY_ENDED:
            state, reason, step = own["state"], own.get("reason"), own.get("step")
        elif ended or not saver.alive():
            if saver.pid == writer and run.get("state") == "saving":
                state, reason, step = "failed", _cut_short(exit_code, killed, run.get("step")), run.get("step")
            else:
                state, reason = contract.NOT_STARTED, _unstarted_reason(exit_code, killed)
        else:
            state, reason = "saving", None
        out.append({"rank": saver.rank, "pid": saver.pid, "state": state, "step": step, "reason": reason})
    return out


def node_outcome(status: dict[str, Any] | None, savers: list[contract.Saver], *, ended: bool,
                 exit_code: int | None, killed: bool) -> dict[str, Any]:
    """The node's `emergency` for its heartbeat once the notice was delivered: {state, step, reason, ranks}. The
    reason names the first rank whose save did not commit, in one line."""
    run = dict((status or {}).get("emergency") or contract.idle_emergency())
    ranks = rank_outcomes(savers, run, (status or {}).get("pid"), ended=ended, exit_code=exit_code, killed=killed)
    unsaved = [r for r in ranks if r["state"] not in ("committed", "saving")]
    state, reason = run.get("state"), run.get("reason")
    if state not in contract.EMERGENCY_ENDED and ended:
        if state == "saving":
            state, reason = "failed", _cut_short(exit_code, killed, run.get("step"))
        elif not savers:
            state, reason = contract.NOT_STARTED, ("no process of the run handles the notice (it had not reached "
                                                   "respawn.ckpt's loop yet, or does not use respawn.ckpt)")
        else:
            state = contract.NOT_STARTED
    if state != "committed" and unsaved:  # the first rank that did not save, and why
        first = unsaved[0]
        reason = f"rank {first['rank'] or 0}: {first['reason'] or reason}"
    return {"state": state, "step": run.get("step"), "reason": reason, "ranks": ranks}

