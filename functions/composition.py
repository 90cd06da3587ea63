"""What a node of a job is created with, besides its hardware, composed from the job's spec: its labels, the settings
its agent reads (respawn.contract.NodeSettings) and its metadata; and whether that fits Compute Engine's limits.

Pure. The control plane creates every node from this composition (nodespec passes in the deployment's values), and a
spec is admitted only if the largest node it could make fits: `respawn jobs register` checks it before anything is
sent (the application's one way into this module), the controller again when it reads the spec, so that a job that
cannot be created is INVALID with the field named instead of refused by an HTTP 400 at every create.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from respawn import oci
from respawn.contract import (ATTR_AGENT, ATTR_ATTEMPT, ATTR_GENERATION, ATTR_INSTALL_NVIDIA_DRIVER, ATTR_JOB_ID,
                              ATTR_LIBRARY, ATTR_PROJECT, ATTR_SETTINGS, ATTR_STARTUP, DEFAULT_HEARTBEAT_SECONDS,
                              DEFAULT_NOTICE_BUDGET_SECONDS, IMAGE_PINNED, LABEL_ATTEMPT, LABEL_JOB, LABEL_SLOT,
                              MAX_ATTEMPT, MAX_NODE_LABELS, NodeSettings)
from respawn.schema import JobSpec, SpecError, parse_spec

# Compute Engine's limits on a node's metadata (gcp-facts §9; a TPU VM's is a Compute Engine VM's): one value at most
# 256 KiB; all keys and values together less than 512 KB, read as 512,000 bytes, the stricter of its two meanings.
METADATA_VALUE_LIMIT = 256 * 1024
METADATA_TOTAL_LIMIT = 512_000
# What the admission check assumes of the values a job's spec does not give, which the CLI cannot know (the
# deployment's) or read (the startup script is not in the wheel): each at least as long as the real one;
# tests/test_schema.py holds deploy/vm/startup.sh and a deployment's release URIs within them.
STARTUP_SCRIPT_ALLOWANCE = 32 * 1024
_DEPLOYMENT_STAND_INS: dict[str, Any] = dict(
    project="p" * 30,  # project ids have at most 30 characters
    agent="a" * 1024, library="l" * 1024,  # gs://BUCKET/respawn/releases/BUILD/NAME#sha256=HEX
    heartbeat_seconds=sys.float_info.min, notice_budget_seconds=sys.float_info.min,  # the longest float repr
    sweep_topic="t" * 512,  # a topic name or projects/P/topics/T
)


def node_labels(spec: JobSpec, attempt: int, slot: int = 0) -> dict[str, str]:
    out = {**spec.labels, LABEL_JOB: spec.id, LABEL_ATTEMPT: str(attempt)}
    if spec.slots > 1:
        out[LABEL_SLOT] = str(slot)
    return out


def node_settings(spec: JobSpec, *, heartbeat_seconds: float, notice_budget_seconds: float,
                  sweep_topic: str | None, heartbeat_database: str | None = None) -> NodeSettings:
    return NodeSettings(
        command=tuple(spec.trainer.command),
        env=dict(spec.trainer.env),
        checkpoint_uri=spec.checkpoint_uri,
        workdir=spec.trainer.workdir,
        setup=tuple(tuple(c) for c in spec.trainer.setup),
        interpreter=spec.trainer.interpreter,
        setup_timeout_seconds=spec.trainer.setup_timeout_seconds,
        cache=tuple(spec.trainer.cache),
        heartbeat_seconds=heartbeat_seconds,
        notice_budget_seconds=notice_budget_seconds + spec.notice_seconds,
        notice_seconds=spec.notice_seconds,
        sweep_topic=sweep_topic,
        heartbeat_database=heartbeat_database,
        cloud_logging=spec.logs.cloud_logging,
        image=spec.trainer.image,
    )


def node_metadata(spec: JobSpec, attempt: int, project: str, startup_script: str, *, agent: str | None,
                  library: str | None, heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
                  notice_budget_seconds: float = DEFAULT_NOTICE_BUDGET_SECONDS,
                  sweep_topic: str | None = None, heartbeat_database: str | None = None) -> dict[str, str]:
    items = {
        ATTR_STARTUP: startup_script,
        ATTR_JOB_ID: spec.id,
        ATTR_ATTEMPT: str(attempt),
        ATTR_PROJECT: project,
        ATTR_SETTINGS: node_settings(spec, heartbeat_seconds=heartbeat_seconds,
                                     notice_budget_seconds=notice_budget_seconds, sweep_topic=sweep_topic,
                                     heartbeat_database=heartbeat_database).to_json(),
    }
    # Always set by deploy/; local runs (sim/) may start the agent without the startup script.
    for attribute, artifact in ((ATTR_AGENT, agent), (ATTR_LIBRARY, library)):
        if artifact:
            items[attribute] = artifact
    if spec.accelerator.kind == "gpu":
        # Deep Learning VM images whose family names a driver (*-nvidia-580, the default) ship it; older ones
        # installed it on first boot only when asked. Harmless where the driver is there or the image ignores the
        # key (gcp-facts §9). TPU VMs have no NVIDIA GPU and never get it.
        items[ATTR_INSTALL_NVIDIA_DRIVER] = "True"
    if spec.slots > 1:
        # Present but empty: the agent is a member and waits until the controller writes a generation naming it.
        items[ATTR_GENERATION] = ""
    return items


def _kib(size: int) -> str:
    return f"{size / 1024:.1f} KiB"


def _metadata_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
    """Whether the metadata a node of `spec` would be created with exceeds Compute Engine's limits; if so, one error
    on the field of the spec that holds the most of it (only the spec's own fields vary, all of them inside
    respawn-settings)."""
    image = spec.trainer.image
    if image is not None and not IMAGE_PINNED.match(image):  # as written; nodes get it pinned, a digest longer
        pinned = oci.parse(image).pinned("sha256:" + "0" * 64)
        spec = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"image": pinned})})
    items = node_metadata(spec, MAX_ATTEMPT, startup_script="#" * STARTUP_SCRIPT_ALLOWANCE, **_DEPLOYMENT_STAND_INS)
    sizes = {key: len(value.encode()) for key, value in items.items()}
    over = [f"the node's metadata value {key} would be {size:,} bytes, over the {METADATA_VALUE_LIMIT:,} (256 KiB) "
            "Compute Engine allows per value" for key, size in sizes.items() if size > METADATA_VALUE_LIMIT]
    total = sum(len(key.encode()) + size for key, size in sizes.items())
    if total >= METADATA_TOTAL_LIMIT:
        over.append(f"the node's metadata would be {total:,} bytes in all, over the 512 KB Compute Engine allows")
    if not over:
        return []
    fields = {("trainer", "command"): spec.trainer.command, ("trainer", "env"): spec.trainer.env,
              ("trainer", "setup"): spec.trainer.setup, ("trainer", "workdir"): spec.trainer.workdir,
              ("trainer", "interpreter"): spec.trainer.interpreter, ("trainer", "image"): spec.trainer.image,
              ("checkpoint_uri",): spec.checkpoint_uri}
    field_sizes = {loc: len(json.dumps(value).encode()) for loc, value in fields.items()}
    loc = max(field_sizes, key=field_sizes.__getitem__)
    return [(loc, f"{_kib(field_sizes[loc])} here: {'; '.join(over)}. Keep large data out of the job spec: in the "
                  "workdir (`respawn jobs register --workdir DIR`), or in a file the trainer reads")]


def _label_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
    labels = node_labels(spec, MAX_ATTEMPT, slot=spec.slots - 1)
    if len(labels) <= MAX_NODE_LABELS:
        return []
    own = sorted(set(labels) - set(spec.labels))
    return [(("labels",), f"{len(spec.labels)} labels: a node carries at most {MAX_NODE_LABELS}, and Respawn writes "
                          f"{len(own)} of its own on this job's nodes ({', '.join(own)}); keep at most "
                          f"{MAX_NODE_LABELS - len(own)}")]


def fit_errors(spec: JobSpec) -> list[str]:
    """One `field.path: what is wrong` line per way the largest node `spec` could make exceeds the platform's limits
    (the labels a node carries, its metadata); none when it fits."""
    return [f"{'.'.join(loc)}: {message}" for loc, message in _label_errors(spec) + _metadata_errors(spec)]


def admit(data: Any, stored: bool = False) -> JobSpec:
    """The spec a job is registered and run with: valid (schema.parse_spec) and its nodes within the platform's
    limits; else SpecError naming every bad field. `stored`: the job's document, which holds trainer.image pinned by
    digest (`respawn jobs register` resolves a tag), so that every node runs the same bytes."""
    spec = parse_spec(data)
    errors = fit_errors(spec)
    image = spec.trainer.image
    if stored and image is not None and not IMAGE_PINNED.match(image):
        errors.append(f"trainer.image: {image} is not pinned by digest: register the job with `respawn jobs "
                      "register`, which resolves its tag, or write it as NAME:TAG@sha256:HEX")
    if errors:
        raise SpecError(errors)
    return spec
