"""Entry point: the agent zipapp's `__main__` (systemd's ExecStart on a VM: `/opt/respawn/python
/opt/respawn/respawn-agent.pyz`, see deploy/vm/startup.sh), or `python -m respawn.agent` where the wheel is installed.

Environment: GCE_METADATA_HOST (metadata server, as google-auth reads it; default metadata.google.internal),
RESPAWN_NODE_DIR (the node's own disk: local checkpoints, status file, trainer log, agent log; default
/var/lib/respawn), FIRESTORE_EMULATOR_HOST (local runs), RESPAWN_STORAGE_HOST or STORAGE_EMULATOR_HOST (the Cloud
Storage host for the workdir and library downloads). Everything else comes from metadata attributes.

Exit status (respawn.contract): 0 after the trainer's end or a notice has been reported; 1 if the final heartbeat
could not be written (systemd restarts the agent, which reports again); EXIT_CONFIG_ERROR for missing or invalid
metadata attributes; EXIT_AGENT_DETACH after SIGHUP (restart me, the trainer keeps running).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TextIO

from respawn.contract import EXIT_CONFIG_ERROR, NODES_DATABASE, heartbeat_id, log_labels
from respawn.logs import log, set_labels

from .config import ConfigError, load_config
from .firestore_rest import FirestoreWriter
from .logship import AGENT_LOG
from .membership import join
from .metadata import MetadataClient


class _Tee:
    """The agent's log lines go to stdout (journald, the demo) and to agent.log on the node's disk."""

    def __init__(self, *streams: TextIO):
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            try:
                s.write(text)
            except (OSError, ValueError):
                pass
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            try:
                s.flush()
            except (OSError, ValueError):
                pass


def main(argv: list[str] | None = None) -> int:
    from .agent import Agent, install_signal_handlers

    # A SIGTERM while the configuration is still being read is a notice too: remember it until the agent exists.
    early: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: early.append("sigterm"))
    md = MetadataClient()
    node_dir = os.path.abspath(os.environ.get("RESPAWN_NODE_DIR") or "/var/lib/respawn")
    try:
        os.makedirs(node_dir, exist_ok=True)
        sys.stdout = _Tee(sys.stdout, open(os.path.join(node_dir, AGENT_LOG), "a", buffering=1))  # type: ignore
    except OSError as exc:
        log("ERROR", "cannot use the node directory; set RESPAWN_NODE_DIR to a writable directory",
            node_dir=node_dir, error=str(exc))
        return EXIT_CONFIG_ERROR
    try:
        cfg = load_config(md, node_dir=node_dir)
    except ConfigError as exc:
        log("ERROR", str(exc), attribute=exc.attribute, metadata=md.host,
            hint="the control plane sets respawn-* attributes when it creates the node; recreate the node")
        return EXIT_CONFIG_ERROR
    membership = join(cfg, md)
    # Every line from here on carries the job, attempt, node and rank as Cloud Logging labels (respawn.logs).
    set_labels(**log_labels(cfg.job_id, cfg.attempt, heartbeat_id(cfg.node, cfg.worker), membership.rank))
    agent = Agent(cfg, md, FirestoreWriter(cfg.project, md,
                                           database=cfg.settings.heartbeat_database or NODES_DATABASE), membership)
    install_signal_handlers(agent)
    if early:
        agent.on_notice(early[0])
    return agent.run()
