"""What every node is created with, besides its hardware: the metadata attributes the node agent reads
(respawn.contract) and the labels. Pure."""

from __future__ import annotations

import os

from respawn import deployment
from respawn.contract import (ATTR_ATTEMPT, ATTR_INSTALL, ATTR_JOB_ID, ATTR_PROJECT, ATTR_SETTINGS, ATTR_STARTUP,
                              DEFAULT_HEARTBEAT_SECONDS, DEFAULT_NOTICE_BUDGET_SECONDS, LABEL_ATTEMPT, LABEL_JOB,
                              NodeSettings)
from respawn.schema import JobSpec


def settings_json(spec: JobSpec) -> str:
    return NodeSettings(
        command=tuple(spec.trainer.command),
        env=dict(spec.trainer.env),
        checkpoint_uri=spec.checkpoint_uri,
        heartbeat_seconds=float(os.environ.get("RESPAWN_HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS)),
        notice_budget_seconds=float(os.environ.get("RESPAWN_NOTICE_BUDGET_SECONDS", DEFAULT_NOTICE_BUDGET_SECONDS)),
    ).to_json()


def metadata(spec: JobSpec, attempt: int, project: str, startup_script: str) -> dict[str, str]:
    items = {
        ATTR_STARTUP: startup_script,
        ATTR_JOB_ID: spec.id,
        ATTR_ATTEMPT: str(attempt),
        ATTR_PROJECT: project,
        ATTR_SETTINGS: settings_json(spec),
    }
    install = os.environ.get(deployment.ENV_INSTALL)
    if install:  # always set by deploy/; local runs (sim/) start the agent without the startup script
        items[ATTR_INSTALL] = install
    return items


def labels(spec: JobSpec, attempt: int) -> dict[str, str]:
    return {**spec.labels, LABEL_JOB: spec.id, LABEL_ATTEMPT: str(attempt)}
