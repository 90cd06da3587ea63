"""What the agent needs to know, read from the instance's metadata attributes set by the control plane
(respawn.contract: the job id, the attempt, the project, and the NodeSettings JSON) and instance/zone
(projects/NUM/zones/ZONE: the last segment is kept). The node's name — the key of its heartbeat document — is
`{job}-{attempt}`, the name the control plane gave the VM or TPU node; `instance/name` is not used for it, because
on a TPU VM it names the worker (`t1v-n-…-w-0`), not the TPU node.

On a TPU VM, Cloud TPU's own attributes say which host this is and where the others are
(respawn.contract.ATTR_WORKER_NUMBER, ATTR_WORKER_ENDPOINTS, in either of its two formats): the worker's index, the
slice's worker count and worker 0's address (an IP address or a hostname). Without them (a GPU VM), or with one
worker, the node is a single host: worker 0 of 1, master 127.0.0.1.

A flex-start node also carries its run duration (respawn.contract.ATTR_RUN_SECONDS), and a reservation-bound node
its reservation's end (ATTR_RUN_ENDS_AT): the agent acts before that end (run_end.py).

Missing or invalid attributes raise ConfigError naming the attribute; a metadata server that is not reachable
yet (boot, maintenance) is retried for a while first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime

from respawn.contract import (ATTR_ATTEMPT, ATTR_GENERATION, ATTR_HANDOVER, ATTR_JOB_ID, ATTR_LIBRARY, ATTR_PROJECT,
                              ATTR_RUN_ENDS_AT, ATTR_RUN_SECONDS, ATTR_SETTINGS, ATTR_WORKER_ENDPOINTS, ATTR_WORKER_NUMBER,
                              SINGLE_HOST_MASTER_ADDR, Handover, NodeSettings, SettingsError, node_name,
                              parse_worker_endpoints, split_artifact)
from respawn.logs import log

from .metadata import TRANSPORT_ERRORS, MetadataClient, MetadataError

DEFAULT_NODE_DIR = "/var/lib/respawn"
ADDRESS_PATH = "instance/network-interfaces/0/ip"  # the VM's primary internal IP address


class ConfigError(Exception):
    def __init__(self, attribute: str, problem: str):
        self.attribute = attribute
        super().__init__(f"metadata attribute {attribute}: {problem}")


@dataclass(frozen=True)
class Hosts:
    """This node's place among the job's hosts: what the trainer gets as ENV_NODE_RANK, ENV_NUM_NODES and
    ENV_MASTER_ADDR."""

    worker: int  # this host's index
    count: int  # hosts in the slice
    master_addr: str  # host 0's address: an IP address, or a hostname (a TPU slice whose metadata lists hostnames)


SINGLE_HOST = Hosts(0, 1, SINGLE_HOST_MASTER_ADDR)


@dataclass(frozen=True)
class AgentConfig:
    job_id: str
    attempt: int
    project: str
    node: str
    zone: str | None
    settings: NodeSettings
    node_dir: str
    library: tuple[str, str] | None = None  # ATTR_LIBRARY: (wheel URI, sha256) to install into the interpreter
    hosts: Hosts = SINGLE_HOST  # ATTR_WORKER_NUMBER, ATTR_WORKER_ENDPOINTS on a multi-host TPU slice
    # ATTR_GENERATION at boot: None on a node that is not a member of a multi-node job; "" on a member before the
    # first generation forms. A member's ranks come from the generation, which the agent follows (agent.py).
    generation: str | None = None
    handover: Handover | None = None  # ATTR_HANDOVER: created during this node's predecessor's notice
    # A multi-node member's own address (instance/network-interfaces/0/ip), where it serves its checkpoints to its
    # peers (peers.py); None elsewhere, or when the metadata server has none.
    address: str | None = None
    # ATTR_RUN_SECONDS: a flex-start node's run duration, from the VM's start (run_end.py); None on any other node.
    run_seconds: int | None = None
    # ATTR_RUN_ENDS_AT: a reservation-bound node's end, seconds since the epoch; None on any other node.
    run_ends_at: float | None = None

    @property
    def worker(self) -> int:
        return self.hosts.worker


def parse_hosts(worker_text: str, endpoints_text: str) -> Hosts:
    """The two TPU worker attributes ("" when not set) → Hosts. Neither set, or one worker: a single host (its
    master is this machine's loopback, which needs no name resolution). A slice's worker always has both; one
    without the other, a worker number outside the endpoints or malformed values are a ConfigError naming the
    attribute and the value."""
    worker_text, endpoints_text = worker_text.strip(), endpoints_text.strip()
    if not worker_text and not endpoints_text:
        return SINGLE_HOST
    worker = 0
    if worker_text:
        if not worker_text.isdigit():
            raise ConfigError(ATTR_WORKER_NUMBER, f"must be a non-negative integer, got {worker_text!r}")
        worker = int(worker_text)
    if not endpoints_text:
        if worker == 0:
            return SINGLE_HOST  # a single-host TPU VM may carry its index alone
        raise ConfigError(ATTR_WORKER_ENDPOINTS, f"not set, yet {ATTR_WORKER_NUMBER} is {worker}: this worker "
                                                 "cannot find worker 0")
    try:
        addresses = parse_worker_endpoints(endpoints_text)
    except ValueError as exc:
        raise ConfigError(ATTR_WORKER_ENDPOINTS, str(exc)) from None
    if not worker_text and len(addresses) > 1:
        raise ConfigError(ATTR_WORKER_NUMBER, f"not set, yet {ATTR_WORKER_ENDPOINTS} lists {len(addresses)} "
                                              "workers: which one is this?")
    if worker >= len(addresses):
        raise ConfigError(ATTR_WORKER_NUMBER, f"is {worker}, but {ATTR_WORKER_ENDPOINTS} lists {len(addresses)} "
                                              f"worker(s): {endpoints_text!r}")
    if len(addresses) == 1:
        return SINGLE_HOST
    return Hosts(worker, len(addresses), addresses[0])


def parse_settings(text: str) -> NodeSettings:
    """The respawn-settings attribute, validated by respawn.contract.NodeSettings."""
    try:
        return NodeSettings.from_json(text)
    except SettingsError as exc:
        raise ConfigError(ATTR_SETTINGS, str(exc)) from None


def parse_attempt(text: str) -> int:
    try:
        attempt = int(text.strip())
    except ValueError:
        raise ConfigError(ATTR_ATTEMPT, f"must be a positive integer, got {text!r}") from None
    if attempt < 1:
        raise ConfigError(ATTR_ATTEMPT, f"must be a positive integer, got {attempt}")
    return attempt


def parse_run_seconds(text: str) -> int | None:
    """The respawn-run-seconds attribute ("" when not set): a positive whole number of seconds, or None."""
    text = text.strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(ATTR_RUN_SECONDS, f"must be a positive whole number of seconds (the VM's run duration), "
                                            f"got {text!r}")
    return int(text)


def parse_run_ends_at(text: str) -> float | None:
    """The respawn-run-ends-at attribute ("" when not set): an RFC 3339 time with its offset, as seconds since the
    epoch, or None."""
    text = text.strip()
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise ConfigError(ATTR_RUN_ENDS_AT, f"must be an RFC 3339 time with its offset (the reservation's end), "
                                            f"got {text!r}")
    return at.timestamp()


def zone_from_metadata(value: str) -> str | None:
    """`projects/123/zones/us-central1-a` → `us-central1-a`."""
    value = value.strip().rstrip("/")
    return value.rsplit("/", 1)[-1] or None


def parse_library(text: str) -> tuple[str, str]:
    """The respawn-library attribute: "URI#sha256=HEX" of the respawn wheel."""
    try:
        return split_artifact(text)
    except ValueError as exc:
        raise ConfigError(ATTR_LIBRARY, str(exc)) from None


def _read(md: MetadataClient, path: str, attribute: str, retry_seconds: float, *, optional: bool = False,
          missing: str | None = "") -> str | None:
    """Read a key, retrying transport errors and 5xx (boot, maintenance) for up to `retry_seconds`. An `optional`
    key that is not set reads as `missing`."""
    deadline = time.monotonic() + retry_seconds
    delay = 0.2
    while True:
        try:
            value, _ = md.read(path)
        except MetadataError as exc:
            if exc.status == 404 and optional:
                return missing
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
            if not value.strip() and not optional:
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
    library_text = _read(md, attr + ATTR_LIBRARY, ATTR_LIBRARY, retry_seconds, optional=True).strip()
    worker_text = _read(md, attr + ATTR_WORKER_NUMBER, ATTR_WORKER_NUMBER, retry_seconds, optional=True)
    endpoints_text = _read(md, attr + ATTR_WORKER_ENDPOINTS, ATTR_WORKER_ENDPOINTS, retry_seconds, optional=True)
    hosts = parse_hosts(worker_text, endpoints_text)
    if endpoints_text.strip():  # what Cloud TPU served, in which of its formats: the record to check it against
        log("INFO", "TPU worker metadata", worker=hosts.worker, workers=hosts.count, master_addr=hosts.master_addr,
            worker_network_endpoints=endpoints_text.strip()[:4000])
    generation = _read(md, attr + ATTR_GENERATION, ATTR_GENERATION, retry_seconds, optional=True, missing=None)
    if generation is not None and hosts != SINGLE_HOST:
        raise ConfigError(ATTR_GENERATION, "is set on a worker of a multi-host TPU slice: a TPU job is one node, "
                                           "its workers' ranks come from the slice")
    address = (None if generation is None else
               _read(md, ADDRESS_PATH, ADDRESS_PATH, retry_seconds, optional=True).strip())
    handover_text = _read(md, attr + ATTR_HANDOVER, ATTR_HANDOVER, retry_seconds, optional=True).strip()
    try:
        handover = Handover.from_json(handover_text) if handover_text else None
    except ValueError as exc:
        raise ConfigError(ATTR_HANDOVER, str(exc)) from None
    run_seconds = parse_run_seconds(_read(md, attr + ATTR_RUN_SECONDS, ATTR_RUN_SECONDS, retry_seconds,
                                          optional=True))
    run_ends_at = parse_run_ends_at(_read(md, attr + ATTR_RUN_ENDS_AT, ATTR_RUN_ENDS_AT, retry_seconds,
                                          optional=True))
    return AgentConfig(
        job_id=job_id, attempt=attempt, project=project, node=node, zone=zone, settings=settings,
        node_dir=os.path.abspath(node_dir or os.environ.get("RESPAWN_NODE_DIR") or DEFAULT_NODE_DIR),
        library=parse_library(library_text) if library_text else None, hosts=hosts, generation=generation,
        handover=handover, address=address or None, run_seconds=run_seconds, run_ends_at=run_ends_at,
    )
