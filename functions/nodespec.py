"""What every node is created with, besides its hardware: the metadata attributes the node agent reads (contract
with node_agent/config.py) and the labels. Pure."""

from __future__ import annotations

import json
import os

from respawn import deployment
from respawn.schema import JobSpec

ATTR_JOB_ID = "respawn-job-id"
ATTR_ATTEMPT = "respawn-attempt"
ATTR_PROJECT = "respawn-project"
ATTR_SETTINGS = "respawn-settings"
ATTR_STARTUP = "startup-script"
ATTR_INSTALL = "respawn-install"  # the pip requirement deploy/vm/startup.sh installs (env RESPAWN_INSTALL)
LABEL_JOB = "respawn-job"
LABEL_ATTEMPT = "respawn-attempt"
HEARTBEAT_SECONDS = 15
NOTICE_BUDGET_SECONDS = 25


def settings_json(spec: JobSpec) -> str:
    return json.dumps({
        "command": list(spec.trainer.command),
        "env": dict(spec.trainer.env),
        "checkpoint_uri": spec.checkpoint_uri,
        "heartbeat_seconds": int(os.environ.get("RESPAWN_HEARTBEAT_SECONDS", HEARTBEAT_SECONDS)),
        "notice_budget_seconds": float(os.environ.get("RESPAWN_NOTICE_BUDGET_SECONDS", NOTICE_BUDGET_SECONDS)),
    }, sort_keys=True)


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
