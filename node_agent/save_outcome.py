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


def rank_outcomes(savers: list[contract.Saver], *, ended: bool, exit_code: int | None,
                  killed: bool) -> list[dict[str, Any]]:
    """Each saver's outcome: its own record, or (the run over) not started, or (still running) saving."""
    out = []
    for saver in savers:
        own = saver.outcome or {}
        if own.get("state") in contract.EMERGENCY_ENDED:
            state, reason = own["state"], own.get("reason")
        elif ended or not saver.alive():
            state, reason = contract.NOT_STARTED, _unstarted_reason(exit_code, killed)
        else:
            state, reason = "saving", None
        out.append({"rank": saver.rank, "pid": saver.pid, "state": state, "step": own.get("step"),
                    "reason": reason})
    return out


def node_outcome(status: dict[str, Any] | None, savers: list[contract.Saver], *, ended: bool,
                 exit_code: int | None, killed: bool) -> dict[str, Any]:
    """The node's `emergency` for its heartbeat once the notice was delivered: {state, step, reason, ranks}. The
    reason names the first rank whose save did not commit, in one line."""
    run = dict((status or {}).get("emergency") or contract.idle_emergency())
    ranks = rank_outcomes(savers, ended=ended, exit_code=exit_code, killed=killed)
    unsaved = [r for r in ranks if r["state"] not in ("committed", "saving")]
    state, reason = run.get("state"), run.get("reason")
    if state not in contract.EMERGENCY_ENDED and ended:
        if state == "saving":
            how = "killed at the notice deadline" if killed else f"the trainer exited {exit_code}"
            state, reason = "failed", f"{how} while saving step {run.get('step')}"
        elif not savers:
            state, reason = contract.NOT_STARTED, ("no process of the run handles the notice (it had not reached "
                                                   "respawn.ckpt's loop yet, or does not use respawn.ckpt)")
        else:
            state = contract.NOT_STARTED
    if state != "committed" and unsaved:  # the first rank that did not save, and why
        first = unsaved[0]
        reason = f"rank {first['rank'] or 0}: {first['reason'] or reason}"
    return {"state": state, "step": run.get("step"), "reason": reason, "ranks": ranks}

