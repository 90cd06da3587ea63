"""What every node is created with, besides its hardware: the metadata attributes the node agent reads
(respawn.contract) and the labels. Pure: the deployment's values (settings.NodeOptions: the agent's heartbeat
period and notice budget, what the startup script installs) are passed in."""

from __future__ import annotations

from respawn.contract import (ATTR_AGENT, ATTR_ATTEMPT, ATTR_GENERATION, ATTR_INSTALL_NVIDIA_DRIVER, ATTR_JOB_ID,
                              ATTR_LIBRARY, ATTR_PROJECT, ATTR_SETTINGS, ATTR_STARTUP, LABEL_ATTEMPT, LABEL_JOB,
                              LABEL_SLOT, NodeSettings)
from respawn.control.settings import NodeOptions
from respawn.schema import JobSpec

DEFAULTS = NodeOptions()


def settings_json(spec: JobSpec, options: NodeOptions = DEFAULTS) -> str:
    return NodeSettings(
        command=tuple(spec.trainer.command),
        env=dict(spec.trainer.env),
        checkpoint_uri=spec.checkpoint_uri,
        workdir=spec.trainer.workdir,
        setup=tuple(tuple(c) for c in spec.trainer.setup),
        interpreter=spec.trainer.interpreter,
        setup_timeout_seconds=spec.trainer.setup_timeout_seconds,
        heartbeat_seconds=options.heartbeat_seconds,
        notice_budget_seconds=options.notice_budget_seconds,
        sweep_topic=options.sweep_topic,
    ).to_json()


def metadata(spec: JobSpec, attempt: int, project: str, startup_script: str,
             options: NodeOptions = DEFAULTS) -> dict[str, str]:
    items = {
        ATTR_STARTUP: startup_script,
        ATTR_JOB_ID: spec.id,
        ATTR_ATTEMPT: str(attempt),
        ATTR_PROJECT: project,
        ATTR_SETTINGS: settings_json(spec, options),
    }
    # Always set by deploy/; local runs (sim/) may start the agent without the startup script.
    for attribute, artifact in ((ATTR_AGENT, options.agent), (ATTR_LIBRARY, options.library)):
        if artifact:
            items[attribute] = artifact
    if spec.accelerator.kind == "gpu":
        # A Deep Learning VM image installs the NVIDIA driver on first boot only when asked (gcp-facts §9); other
        # images ignore the key. TPU VMs have no NVIDIA GPU and never get it.
        items[ATTR_INSTALL_NVIDIA_DRIVER] = "True"
    if spec.nodes > 1:
        # Present but empty: the agent is a member and waits until the controller writes a generation naming it.
        items[ATTR_GENERATION] = ""
    return items


def labels(spec: JobSpec, attempt: int, slot: int = 0) -> dict[str, str]:
    out = {**spec.labels, LABEL_JOB: spec.id, LABEL_ATTEMPT: str(attempt)}
    if spec.nodes > 1:
        out[LABEL_SLOT] = str(slot)
    return out
