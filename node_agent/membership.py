"""Which generation this node trains in: a node's trainer runs in one generation at a time, and the membership says
when to start it, with what ranks, and whether its end ends the node's life.

- `OneMember`: a one-node job. Its one generation has one member, this node, and is formed when the node boots:
  the control plane writes a one-node job no ATTR_GENERATION (the node contract), its hosts' ranks come from the
  node itself (config.Hosts: a TPU slice's workers), and the trainer starts as soon as the node is prepared. Its
  trainer's end, with any exit status, ends the node's life: what happens next is the controller's decision.
- `Generations`: a member of a multi-node job (contract.Generation, ATTR_GENERATION, which the control plane writes
  and rewrites). A prepared member says so (`waiting`) and starts its trainer when a generation names it, and
  again, with the new ranks, for every newer one; only a trainer that finished (exit 0) ends its life. It also serves
  its committed checkpoints to the job's other nodes (peers.py) and probes its generation's master (reach.py).

`join` picks one: the only place that asks whether a job has one node.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence, Union

from respawn import contract
from respawn.logs import log, set_labels

from .config import AgentConfig
from .metadata import MetadataClient
from .peers import PeerServer, listen_port, peers_env, serve as serve_peers
from .reach import MasterProbe
from .signal_safe import SignalSafeEvent
from .supervisor import TrainerRecord
from .watcher import ValueWatcher


class OneMember:
    """A one-node job's membership: one generation of this node alone, never renumbered (the heartbeat's and the
    trainer record's `generation` stay None)."""

    formed_by_controller = False  # the node forms its generation itself: it never waits to be named

    def __init__(self, cfg: AgentConfig):
        self.rank: int | None = cfg.worker  # the log labels' respawn_rank: the host's place in its slice
        self.running: int | None = None  # the generation the trainer runs: none is numbered
        self._started = False

    def start(self, wake: SignalSafeEvent) -> None:
        pass

    def due(self) -> "OneMember | None":
        """The generation to start the trainer in now (itself, once), or None."""
        return None if self._started else self

    def newer(self) -> bool:
        return False

    def ends_life(self, code: int | None) -> bool:
        return True

    def handovers(self, generation: "OneMember") -> Sequence[contract.Handover]:
        return ()

    def trainer_env(self, generation: "OneMember") -> dict[str, str]:
        return {}  # the hosts' ranks are in every trainer's environment already

    def joining(self, generation: "OneMember") -> dict[str, Any]:
        """What the trainer record says of the generation its trainer starts in."""
        return {}

    def entered(self, generation: "OneMember") -> bool:
        """The trainer started in `generation`. True when the heartbeat's generation changed (write one now)."""
        self._started = True
        return False

    def adopt(self, record: TrainerRecord) -> None:
        self._started = True

    def beat(self, training: bool) -> dict[str, Any]:
        return {"generation": None, "master_reachable": None}


class Generations:
    """A multi-node member's membership: the newest generation the metadata server gave (`newest`), the one its
    trainer runs or last ran (`running`, `members`: None for an adopted trainer's unknown members)."""

    formed_by_controller = True  # the controller forms a generation with this node once it beats `waiting`

    def __init__(self, cfg: AgentConfig, md: MetadataClient):
        self.cfg = cfg
        self.wake = SignalSafeEvent()  # set on each new generation: the agent's main loop's, from start()
        self.rank: int | None = None  # until a generation gives this member one
        self.newest: contract.Generation | None = None
        self.running: int | None = None
        self.members: tuple[str, ...] | None = None
        self._lock = threading.Lock()
        self._watch = ValueWatcher(md, f"instance/attributes/{contract.ATTR_GENERATION}", self.on_generation,
                                   wait_seconds=cfg.settings.metadata_wait_seconds)
        self._probe = MasterProbe(cfg.settings.heartbeat_seconds)
        self.peers: PeerServer | None = None

    def start(self, wake: SignalSafeEvent) -> None:
        self.wake = wake
        self._watch.start()
        self._probe.start()
        # A member's committed steps, for a replacement to restore from (peers.py); the server lives as the agent.
        self.peers = serve_peers(os.path.join(self.cfg.node_dir, contract.LOCAL_CHECKPOINT_DIR), self.cfg.address)

    def on_generation(self, text: str) -> None:
        """Called by the generation watcher with each new value of ATTR_GENERATION."""
        if not text.strip():
            return  # no generation has formed yet
        try:
            generation = contract.Generation.from_json(text)
        except ValueError as exc:
            log("ERROR", "ignoring a malformed generation; the control plane writes the next one", error=str(exc))
            return
        with self._lock:
            if self.newest is None or generation.number > self.newest.number:
                self.newest = generation
        log("INFO", "generation received", generation=generation.number, members=list(generation.members),
            master_addr=generation.master_addr, member=self.cfg.node in generation.members)
        self.wake.set()

    def due(self) -> contract.Generation | None:
        """The newest generation when it names this node and the trainer does not run in it, else None."""
        generation = self.newest
        if generation is None or generation.number == self.running or self.cfg.node not in generation.members:
            return None
        return generation

    def newer(self) -> bool:
        """A newer generation than the trainer's: it stops (or rejoins) for it."""
        return self.newest is not None and self.newest.number != self.running

    def ends_life(self, code: int | None) -> bool:
        return code == 0  # any other end waits for the next generation: the control plane decides

    def handovers(self, generation: contract.Generation) -> Sequence[contract.Handover]:
        return generation.handover

    def trainer_env(self, generation: contract.Generation) -> dict[str, str]:
        """What a trainer of this node gets in `generation`: its ranks and master for torchrun (PET_*) and for one
        process per node (torch's env://), both on the generation's port, and for anyone (RESPAWN_*)."""
        node, settings = self.cfg.node, self.cfg.settings
        rank, world, master = generation.node_rank(node), generation.world_size, generation.master_addr
        base = settings.env.get("MASTER_PORT", "")
        port = contract.generation_port(generation.number, int(base) if base.isdigit() else
                                        contract.TORCHRUN_MASTER_PORT)
        return {contract.ENV_NODE_RANK: str(rank), contract.ENV_NUM_NODES: str(world),
                contract.ENV_MASTER_ADDR: master, contract.ENV_GENERATION: str(generation.number),
                contract.ENV_REJOIN_FILE: os.path.join(self.cfg.node_dir, contract.REJOIN_FILE),
                **contract.torchrun_env(rank, world, master, port), **contract.torch_env(rank, world, master, port),
                **peers_env(generation, node, listen_port())}

    def joining(self, generation: contract.Generation) -> dict[str, Any]:
        self.rank = generation.node_rank(self.cfg.node)
        set_labels(**contract.log_labels(self.cfg.job_id, self.cfg.attempt, self.cfg.node, self.rank))
        return {"generation": generation.number, "members": list(generation.members)}

    def entered(self, generation: contract.Generation) -> bool:
        # After the trainer's start: a heartbeat in between must never say "waiting in generation N" (a trainer of N
        # that ended), only "training" in the one before, as while the old trainer stopped.
        self.running, self.members = generation.number, generation.members
        return True

    def adopt(self, record: TrainerRecord) -> None:
        self.running = record.generation
        self.members = tuple(record.members) if record.members is not None else None

    def beat(self, training: bool) -> dict[str, Any]:
        """The heartbeat's `generation` and `master_reachable`: the probe aimed at the master of the generation
        this member trains in (none for the master itself)."""
        g = self.newest
        self._probe.aim(g.master_addr if training and g is not None and g.number == self.running
                        and g.members[0] != self.cfg.node else None)
        return {"generation": self.running, "master_reachable": self._probe.reachable}


Membership = Union[OneMember, Generations]


def join(cfg: AgentConfig, md: MetadataClient) -> Membership:
    """A member of a multi-node job has ATTR_GENERATION among its attributes (empty until its first generation
    forms); a one-node job's node has none."""
    return Generations(cfg, md) if cfg.generation is not None else OneMember(cfg)
