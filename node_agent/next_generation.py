"""A multi-node member's running trainer moves into a newer generation (membership.py): handed it in its own process
when it can rejoin (contract.REJOIN_FILE), otherwise stopped, for the agent's main loop to start it again with the
new ranks.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

from respawn import contract
from respawn.logs import log

from .lifecycle import TrainerLife
from .membership import Generations

# A generation of the same members restarts the world because a member's trainer crashed. A trainer blocked in a
# collective with the crashed one cannot run its SIGTERM handler (the signal is only noted until the collective
# returns: at the process group's timeout) and no emergency save is possible without that rank, so the agent kills
# its process group after this grace; the next generation resumes from the newest committed step.
RESTART_STOP_GRACE_S = 5.0
# A trainer handed a generation to rejoin in its process (contract.REJOIN_FILE) first stops at a step boundary with
# an emergency save, as on a notice (notice_budget_seconds); this long more for it to say it has left its world.
REJOIN_ACK_GRACE_S = 5.0

JOINED, ENDED, NOTICED = "joined", "ended", "noticed"


def move(life: TrainerLife, membership: Generations, *, node: str, budget_s: float,
         noticed: Callable[[], bool]) -> tuple[str, int | None]:
    """Move the trainer into `membership.newest`. New members (a node joined or left): a trainer that can rejoin is
    handed the generation and goes on in its process; otherwise SIGTERM, the emergency save as on a notice, bounded
    by the notice budget (`budget_s`), then its process group is killed. The same members (a member's trainer
    crashed): SIGTERM, killed after RESTART_STOP_GRACE_S. Returns (JOINED, None): the same trainer runs the new
    generation; (NOTICED, None): a notice came during the hand-over, which the agent handles next; (ENDED, exit
    status): the trainer ended, stopped or on its own, and the node waits for the next generation."""
    generation, trainer = membership.newest, life.process
    assert trainer is not None and generation is not None
    restart = generation.members == membership.members
    if not restart:
        handed = _hand_over(life, membership, generation, node=node, budget_s=budget_s, noticed=noticed)
        if handed is not None:
            return handed
    log("WARNING", "new generation: stopping the trainer to restart it with the new membership",
        running=membership.running, newer=generation.number, pid=trainer.pid, same_members=restart)
    trainer.notify()
    if restart:
        return ENDED, life.wait(time.monotonic() + RESTART_STOP_GRACE_S, why=(
            f"the trainer did not stop within {RESTART_STOP_GRACE_S:g} s of its generation's restart (a member's "
            "trainer crashed; this one is most likely blocked in a collective with it); killing its process "
            "group: the next generation resumes from the newest committed checkpoint"))
    return ENDED, life.wait(time.monotonic() + budget_s)


def _hand_over(life: TrainerLife, membership: Generations, generation: contract.Generation, *, node: str,
               budget_s: float, noticed: Callable[[], bool]) -> tuple[str, int | None] | None:
    """Hand `generation` to a trainer that said it can rejoin (its status file: contract.REJOIN_STATES) in its own
    process: write it into REJOIN_FILE, signal the trainer and wait for it to say it left its world for this
    generation (its status's `generation`). None to stop it the old way: it cannot rejoin, or did not answer in
    time."""
    trainer = life.process
    assert trainer is not None
    status = contract.read_status(life.status_path) or {}
    pid = status.get("pid")
    can_leave = status.get("rejoin") in (contract.REJOIN_READY, contract.REJOIN_WAITING)
    if (node not in generation.members or not can_leave
            or status.get("generation") != membership.running or not trainer.owns(pid)):
        return None
    path = os.path.join(life.node_dir, contract.REJOIN_FILE)
    try:
        with open(path + ".tmp", "w") as f:
            f.write(contract.Rejoin(generation.number, membership.trainer_env(generation)).to_json())
        os.replace(path + ".tmp", path)
        os.kill(pid, getattr(signal, contract.REJOIN_SIGNAL))
    except OSError as exc:
        log("WARNING", "cannot hand the new generation to the trainer; restarting it instead", path=path,
            pid=pid, error=str(exc))
        return None
    log("INFO", "new generation: handing it to the trainer, which rejoins in its process",
        running=membership.running, newer=generation.number, pid=pid, trainer_state=status.get("rejoin"))
    deadline = time.monotonic() + budget_s + REJOIN_ACK_GRACE_S
    while time.monotonic() < deadline:
        ended, code = trainer.poll()
        if ended:
            return ENDED, code
        if noticed():
            return NOTICED, None
        status = contract.read_status(life.status_path) or {}
        if status.get("pid") == pid and status.get("generation") == generation.number:
            membership.entered(generation)
            life.joined(generation.number, list(generation.members))
            log("INFO", "the trainer left its world and joins the new generation in its process",
                generation=generation.number, pid=pid, step=status.get("step"))
            return JOINED, None
        time.sleep(0.05)
    log("WARNING", "the trainer did not take the new generation in time; stopping it to start it again",
        generation=generation.number, pid=pid, waited_s=round(budget_s + REJOIN_ACK_GRACE_S, 1))
    return None
