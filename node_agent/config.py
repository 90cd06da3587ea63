"""What the agent needs to know, read from the instance's metadata attributes set by the control plane.

    respawn-job-id     the job id
    respawn-attempt    the attempt number (the node is named {job}-{attempt})
    respawn-project    the GCP project that holds Firestore
    respawn-settings   JSON: {"command": [argv], "env": {...}, "checkpoint_uri": "gs://... | file:///...",
                              "heartbeat_seconds": 15, "notice_budget_seconds": 25}
and instance/zone (projects/NUM/zones/ZONE: the last segment is kept). The node's name — the key of its heartbeat
document — is `{job}-{attempt}`, the name the control plane gave the VM or TPU node; `instance/name` is not used
for it, because on a TPU VM it names the worker (`t1v-n-…-w-0`), not the TPU node.

Missing or invalid attributes raise ConfigError naming the attribute; a metadata server that is not reachable
yet (boot, maintenance) is retried for a while first.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from respawn.logs import log
from respawn.schema import node_name

from .metadata import TRANSPORT_ERRORS, MetadataClient, MetadataError

DEFAULT_NODE_DIR = "/var/lib/respawn"
DEFAULT_HEARTBEAT_SECONDS = 15.0
DEFAULT_NOTICE_BUDGET_SECONDS = 25.0
DEFAULT_METADATA_WAIT_SECONDS = 60.0

ATTR_JOB_ID = "respawn-job-id"
ATTR_ATTEMPT = "respawn-attempt"
ATTR_PROJECT = "respawn-project"
ATTR_SETTINGS = "respawn-settings"


class ConfigError(Exception):
    def __init__(self, attribute: str, problem: str):
        self.attribute = attribute
        super().__init__(f"metadata attribute {attribute}: {problem}")


@dataclass(frozen=True)
class Settings:
    command: list[str]
    checkpoint_uri: str
    env: dict[str, str] = field(default_factory=dict)
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    notice_budget_seconds: float = DEFAULT_NOTICE_BUDGET_SECONDS
    # How long one hanging GET on the metadata server may wait before it is re-issued.
    metadata_wait_seconds: float = DEFAULT_METADATA_WAIT_SECONDS


@dataclass(frozen=True)
class AgentConfig:
    job_id: str
    attempt: int
    project: str
    node: str
    zone: str | None
    settings: Settings
    node_dir: str


def _positive(raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(ATTR_SETTINGS, f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


def parse_settings(text: str) -> Settings:
    """Validate the respawn-settings JSON. Unknown keys are ignored so an older agent accepts newer settings."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(ATTR_SETTINGS, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(ATTR_SETTINGS, f"must be a JSON object, got {type(raw).__name__}")
    command = raw.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        raise ConfigError(ATTR_SETTINGS, "command must be a non-empty argv list of strings, e.g. [\"python\", \"train.py\"]")
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(ATTR_SETTINGS, "env must be an object of string values")
    uri = raw.get("checkpoint_uri")
    if not isinstance(uri, str) or not uri.startswith(("gs://", "file:///")):
        raise ConfigError(ATTR_SETTINGS, f"checkpoint_uri must be gs://BUCKET/PREFIX or file:///PATH, got {uri!r}")
    return Settings(
        command=list(command),
        checkpoint_uri=uri,
        env=dict(env),
        heartbeat_seconds=_positive(raw, "heartbeat_seconds", DEFAULT_HEARTBEAT_SECONDS),
        notice_budget_seconds=_positive(raw, "notice_budget_seconds", DEFAULT_NOTICE_BUDGET_SECONDS),
        metadata_wait_seconds=_positive(raw, "metadata_wait_seconds", DEFAULT_METADATA_WAIT_SECONDS),
    )


def parse_attempt(text: str) -> int:
    try:
        attempt = int(text.strip())
    except ValueError:
        raise ConfigError(ATTR_ATTEMPT, f"must be a positive integer, got {text!r}") from None
    if attempt < 1:
        raise ConfigError(ATTR_ATTEMPT, f"must be a positive integer, got {attempt}")
    return attempt


def zone_from_metadata(value: str) -> str | None:
    """`projects/123/zones/us-central1-a` → `us-central1-a`."""
    value = value.strip().rstrip("/")
    return value.rsplit("/", 1)[-1] or None


def _read(md: MetadataClient, path: str, attribute: str, retry_seconds: float) -> str:
    """Read a key, retrying transport errors and 5xx (boot, maintenance) for up to `retry_seconds`."""
    deadline = time.monotonic() + retry_seconds
    delay = 0.2
    while True:
        try:
            value, _ = md.read(path)
        except MetadataError as exc:
            if exc.status == 404:
                raise ConfigError(attribute, f"not set on this instance (GET {path} answered 404)") from None
            if exc.status < 500 or time.monotonic() >= deadline:
                raise ConfigError(attribute, str(exc)) from None
        except TRANSPORT_ERRORS as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    attribute, f"metadata server {md.host} not reachable ({exc!r}); check GCE_METADATA_HOST"
                ) from None
        else:
            if not value.strip():
                raise ConfigError(attribute, "is empty")
            return value
        log("WARNING", "metadata server not answering yet; retrying", path=path, retry_in_s=delay)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def load_config(md: MetadataClient, *, node_dir: str | None = None, retry_seconds: float = 120.0) -> AgentConfig:
    attr = "instance/attributes/"
    job_id = _read(md, attr + ATTR_JOB_ID, ATTR_JOB_ID, retry_seconds).strip()
    attempt = parse_attempt(_read(md, attr + ATTR_ATTEMPT, ATTR_ATTEMPT, retry_seconds))
    project = _read(md, attr + ATTR_PROJECT, ATTR_PROJECT, retry_seconds).strip()
    settings = parse_settings(_read(md, attr + ATTR_SETTINGS, ATTR_SETTINGS, retry_seconds))
    try:
        node = node_name(job_id, attempt)
    except ValueError as exc:
        raise ConfigError(ATTR_ATTEMPT, str(exc)) from None
    zone = zone_from_metadata(_read(md, "instance/zone", "instance/zone", retry_seconds))
    return AgentConfig(
        job_id=job_id, attempt=attempt, project=project, node=node, zone=zone, settings=settings,
        node_dir=os.path.abspath(node_dir or os.environ.get("RESPAWN_NODE_DIR") or DEFAULT_NODE_DIR),
    )
