"""Handovers: a node that takes over from one still in its notice waits for it to stop before its trainer starts, so
that two trainers of one place never write checkpoints at once.

Whom to wait for: the node this one replaces during its notice (ATTR_HANDOVER, read at boot and used once), and a
generation's members that left it during their notice (contract.Generation.handover). Each is waited for until its
final heartbeat says it stopped (its emergency checkpoint is then committed or given up), it never beat, or its
notice is over. Preparation runs before, so the wait overlaps nothing but the predecessor's save.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable, Sequence

from respawn import contract
from respawn.contract import NodeState
from respawn.logs import log

from .config import AgentConfig
from .firestore_rest import FirestoreError, FirestoreWriter
from .metadata import TRANSPORT_ERRORS, TokenError

HANDOVER_POLL_S = 0.5  # how often a node created during its predecessor's notice reads that one's heartbeat


class Handovers:
    def __init__(self, cfg: AgentConfig, writer: FirestoreWriter, interrupted: Callable[[], bool]):
        self.node, self.worker = cfg.node, cfg.worker
        self.writer, self.interrupted = writer, interrupted
        self._boot = cfg.handover  # ATTR_HANDOVER: waited for before the first trainer only

    def wait(self, named: Sequence[contract.Handover] = ()) -> bool:
        """Wait for the boot's handover (the first time) and each of `named` but this node. False when a notice or
        SIGHUP came first."""
        boot, self._boot = self._boot, None
        for handover in [*([boot] if boot is not None else []), *(h for h in named if h.node != self.node)]:
            if not self._wait_one(handover):
                return False
        return True

    def _wait_one(self, handover: contract.Handover) -> bool:
        until = datetime.fromisoformat(handover.until)
        doc = contract.heartbeat_id(handover.node, self.worker)
        log("INFO", "taking over from a node in its notice: waiting for it to stop before training",
            predecessor=handover.node, until=handover.until)
        started, warned = time.monotonic(), False
        while not self.interrupted():
            if datetime.now(timezone.utc) >= until:
                log("INFO", "handover: the predecessor's notice is over; training", predecessor=handover.node,
                    waited_s=round(time.monotonic() - started, 2))
                return True
            try:
                state = self.writer.get_string(contract.NODES_COLLECTION, doc, "state")
            except (FirestoreError, TokenError, *TRANSPORT_ERRORS) as exc:
                if not warned:
                    log("WARNING", "handover: cannot read the predecessor's heartbeat; waiting for its notice to end "
                                   "instead", predecessor=handover.node, error=str(exc) or repr(exc))
                    warned = True
            else:
                if state in (None, NodeState.EXITED.value):
                    log("INFO", "handover: the predecessor stopped; training", predecessor=handover.node,
                        predecessor_state=state, waited_s=round(time.monotonic() - started, 2))
                    return True
            time.sleep(HANDOVER_POLL_S)
        return False
