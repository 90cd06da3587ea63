"""What every node is created with, besides its hardware: the metadata attributes the node agent reads
(respawn.contract) and the labels. Pure. The composition from the spec is composition's (node_metadata, node_labels),
whose admission check holds it within Compute Engine's limits at registration; this module passes in the
deployment's values (settings.NodeOptions: the agent's heartbeat period and notice budget, what the startup script
installs)."""

from __future__ import annotations

from datetime import datetime, timezone

from respawn.contract import ATTR_HANDOVER, ATTR_RUN_ENDS_AT, ATTR_RUN_SECONDS, Handover
from respawn.deployment import heartbeat_database
from respawn.schema import JobSpec

from .composition import node_labels, node_metadata, node_settings
from .settings import NodeOptions

DEFAULTS = NodeOptions()


def _deployment(options: NodeOptions) -> dict:
    return dict(heartbeat_seconds=options.heartbeat_seconds, notice_budget_seconds=options.notice_budget_seconds,
                sweep_topic=options.sweep_topic)


def settings_json(spec: JobSpec, options: NodeOptions = DEFAULTS) -> str:
    return node_settings(spec, **_deployment(options)).to_json()


def metadata(spec: JobSpec, attempt: int, project: str, startup_script: str,
             options: NodeOptions = DEFAULTS, service_account: str | None = None,
             handover: Handover | None = None, run_seconds: int | None = None,
             run_ends_at: datetime | None = None) -> dict[str, str]:
    """`service_account`: the node identity the node runs as; its heartbeats go to that identity's database.
    `handover`: the node this one replaces during its notice (decide._on_notice). `run_seconds`: a flex-start
    node's run duration; `run_ends_at`: a reservation-bound node's end."""
    items = node_metadata(spec, attempt, project, startup_script, agent=options.agent, library=options.library,
                          heartbeat_database=heartbeat_database(service_account) if service_account else None,
                          **_deployment(options))
    if handover is not None:
        items[ATTR_HANDOVER] = handover.to_json()
    if run_seconds is not None:
        items[ATTR_RUN_SECONDS] = str(run_seconds)
    if run_ends_at is not None:
        items[ATTR_RUN_ENDS_AT] = run_ends_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return items


def labels(spec: JobSpec, attempt: int, slot: int = 0) -> dict[str, str]:
    return node_labels(spec, attempt, slot)
