"""What the node's heartbeat says of its emergency save after a notice (node_agent/save_outcome.py): the run's outcome
from the status file and each rank's from its entry in the run's notice directory, and a reason that names the first
rank that did not save. A table: what the agent read in, the heartbeat's `emergency` out."""

from __future__ import annotations

import os

import pytest

from respawn import contract
from respawn.agent.save_outcome import node_outcome

GONE = 2 ** 22 + 12345  # no such pid (above the default pid_max): a saver whose process has ended


def saver(rank, state=None, step=None, reason=None, pid=GONE):
    outcome = None if state is None else {"state": state, "step": step, "reason": reason}
    return contract.Saver(pid, "1", rank, outcome)


def status(state, step=None, reason=None, pid=GONE):
    return {"emergency": {"state": state, "step": step, "reason": reason}, "pid": pid}


CASES = {
    "every rank committed": (
        status("committed", 40), [saver(0, "committed", 40), saver(1, "committed", 40)], dict(exit_code=75),
        ("committed", 40, None, ["committed", "committed"])),
    "a rank's save failed: named, with its reason": (
        status("failed", 40, "member 1: OSError: No space left on device"),
        [saver(0, "failed", 40, "member 1: OSError: No space left on device"),
         saver(1, "failed", 40, "OSError: No space left on device")], dict(exit_code=76),
        ("failed", 40, "rank 0: member 1: OSError: No space left on device", ["failed", "failed"])),
    "killed at the deadline while saving (a state too large for the budget)": (
        status("saving", 165), [saver(None)], dict(exit_code=137, killed=True),
        ("failed", 165, "rank 0: killed at the notice deadline while saving step 165", ["failed"])),
    "the deadline reached while writing (the large-state demo scenario's, moved down): abandoned, named": (
        status("abandoned", 162, "deadline reached while writing step 162 (83886080 of 167855780 bytes)"),
        [saver(0, "abandoned", 162, "deadline reached while writing step 162 (83886080 of 167855780 bytes)")],
        dict(exit_code=76),
        ("abandoned", 162, "rank 0: deadline reached while writing step 162 (83886080 of 167855780 bytes)",
         ["abandoned"])),
    "rank 1 ended before its save; rank 0 committed": (
        status("committed", 40), [saver(0, "committed", 40), saver(1)], dict(exit_code=1),
        ("committed", 40, None, ["committed", contract.NOT_STARTED])),
    "no rank began its save": (
        status("idle"), [saver(0), saver(1)], dict(exit_code=1),
        (contract.NOT_STARTED, None, "rank 0: the run ended before this process began its save (the trainer "
                                     "exited 1)", [contract.NOT_STARTED] * 2)),
    "no process handles the notice": (
        status("idle"), [], dict(exit_code=143),
        (contract.NOT_STARTED, None, "no process of the run handles the notice (it had not reached respawn.ckpt's "
                                     "loop yet, or does not use respawn.ckpt)", [])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_heartbeat_says_each_ranks_save(name):
    run, savers, how, (state, step, reason, ranks) = CASES[name]
    got = node_outcome(run, savers, ended=True, killed=how.get("killed", False), exit_code=how["exit_code"])
    assert (got["state"], got["step"], got["reason"]) == (state, step, reason)
    assert [r["state"] for r in got["ranks"]] == ranks


def test_a_rank_still_running_is_saving_until_the_run_ends():
    alive = contract.Saver(os.getpid(), contract.process_start_time(os.getpid()), 0)
    got = node_outcome(status("saving", 9, pid=os.getpid()), [alive], ended=False, exit_code=None, killed=False)
    assert got["state"] == "saving" and got["ranks"][0]["state"] == "saving"
