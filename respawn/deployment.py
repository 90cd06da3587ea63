"""The names a Respawn deployment gives its Google Cloud resources, and the environment the functions get.

The single definition: cloudbuild.yaml reads these (through `python -m deploy.render`, which writes them as shell
variables), the functions and the CLI import them. Imports nothing beyond the standard library and the node contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .contract import NODES_DATABASE

# Pub/Sub topics.
LOG_EVENTS_TOPIC = "respawn-log-events"  # fed by the Logging sink (audit system events)
ALERTS_TOPIC = "respawn-alerts"  # the core publishes alert JSON here; on_alert posts it to Slack
# Cloud Scheduler publishes {"task": "sweep"}; that sweep publishes {"task": "sweep", "job_id": ID} per active job
# back to it (each job's reconcile on an invocation of its own); the CLI nudges one job there on cancel.
SWEEP_TOPIC = "respawn-sweep"

# The Google APIs the deployment uses: the build's `apis` step enables these (deploy/render.py writes them as APIS),
# `respawn doctor` checks that each is enabled.
APIS: tuple[str, ...] = (
    "compute.googleapis.com", "tpu.googleapis.com", "firestore.googleapis.com", "pubsub.googleapis.com",
    "logging.googleapis.com", "cloudfunctions.googleapis.com", "run.googleapis.com", "eventarc.googleapis.com",
    "cloudscheduler.googleapis.com", "secretmanager.googleapis.com", "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com", "iam.googleapis.com", "storage.googleapis.com", "monitoring.googleapis.com",
    "cloudbilling.googleapis.com",
)

SINK = "respawn-system-events"  # the Logging sink that routes respawn.audit.sink_filter() to LOG_EVENTS_TOPIC
SCHEDULER_JOB = "respawn-sweep"
SWEEP_SCHEDULE = "*/2 * * * *"  # a lost audit event delays recovery by at most this period
SWEEP_PERIOD_S = 120.0  # the same period in seconds (the daily log retention picks one tick per job: respawn.joblogs)
SWEEP_MESSAGE = '{"task":"sweep"}'

# Service account IDs (emails are {id}@{project}.iam.gserviceaccount.com).
CONTROLLER_SA = "respawn-controller"  # runs on_job_created, on_log_event, on_sweep
NOTIFIER_SA = "respawn-notifier"  # runs on_alert: reads the Slack secret, nothing else
TRIGGER_SA = "respawn-trigger"  # the identity Eventarc and Pub/Sub use to invoke the functions
# The nodes' identities: a pool of service accounts respawn-node-1 … respawn-node-N (node_identities), each leased to
# one job at a time (respawn.control.identities): a node can reach its own job's checkpoint folder only, the release
# read-only, its heartbeat database, and its job's other nodes (docs/architecture.md, "Isolation between jobs").
NODE_SA = "respawn-node"  # the pool's name prefix
DEFAULT_NODE_IDENTITIES = 8  # at most this many jobs run at once; the build's _NODE_IDENTITIES sets it
# A project holds 100 service accounts by default (3 are Respawn's own) and 100 Firestore databases (one per identity
# for its heartbeats, and (default)).
MAX_NODE_IDENTITIES = 90
_NODE_IDENTITY = re.compile(rf"^{NODE_SA}-([1-9][0-9]*)@")

# The ingress rules that let a multi-node job's members reach each other (torchrun's rendezvous, NCCL, the JAX
# coordinator): one per node identity, from it to itself, every protocol (node_firewall_rule), so the nodes of two
# jobs do not reach each other. Only the auto-created `default` network allows internal traffic by default
# (default-allow-internal, which reaches across jobs); any other network denies ingress.
NODE_FIREWALL_RULE = "respawn-node-internal"
DEFAULT_NETWORK = "default"
# The custom role a job's node identity holds on that job's checkpoint folder (a managed folder), granted by the
# controller when the job takes the identity (deploy/iam/permissions.yaml, scope job-folder).
JOB_DATA_ROLE = "respawnJobData"

# Firestore TTL on event history (respawn.schema.JobEvent.expire_at).
TTL_COLLECTION_GROUP = "events"
TTL_FIELD = "expire_at"

# The checkpoint bucket's folder Respawn keeps for itself (the release, the workdir archives): nodes may read it and
# never change it (deploy/iam/permissions.yaml), so no job's checkpoint_uri may point into it.
RESPAWN_PREFIX = "respawn"
# Where releases of the agent and trainer go, under the checkpoint bucket: gs://{bucket}/{RELEASES_PREFIX}/{build}/.
RELEASES_PREFIX = f"{RESPAWN_PREFIX}/releases"

# Environment variables deploy/ sets on every function (values: deploy/render.py).
ENV_PROJECT = "RESPAWN_PROJECT"  # the project holding Firestore, the nodes and the topics
ENV_REGION = "RESPAWN_REGION"  # where the functions run
ENV_ALERTS_TOPIC = "RESPAWN_ALERTS_TOPIC"  # ALERTS_TOPIC
ENV_SWEEP_TOPIC = "RESPAWN_SWEEP_TOPIC"  # SWEEP_TOPIC: where the scheduled sweep fans out one message per job
ENV_NODE_IDENTITIES = "RESPAWN_NODE_IDENTITIES"  # the pool's emails, comma-separated; unset: the project's default
ENV_AGENT = "RESPAWN_AGENT"  # URI#sha256=HEX of the released agent zipapp -> node metadata respawn-agent
ENV_LIBRARY = "RESPAWN_LIBRARY"  # URI#sha256=HEX of the released wheel -> node metadata respawn-library
ENV_NETWORK = "RESPAWN_NETWORK"  # the nodes' VPC network, when not `default` (projects/P/global/networks/N)
ENV_SUBNETWORK = "RESPAWN_SUBNETWORK"  # its subnetwork in the nodes' region, for a custom-mode network
ENV_COMPUTE_ENDPOINT = "RESPAWN_COMPUTE_ENDPOINT"  # local runs only: the sim's Compute Engine (functions and CLI)
ENV_VERSION = "RESPAWN_VERSION"  # the Cloud Build ID that deployed this code
ENV_SLACK_WEBHOOK_URL = "SLACK_WEBHOOK_URL"  # on_alert only, from Secret Manager
# The Secret Manager secret that holds the Slack webhook URL: the build's _SLACK_SECRET by default (on_alert gets its
# latest version as SLACK_WEBHOOK_URL).
DEFAULT_SLACK_SECRET = "respawn-slack-webhook"


@dataclass(frozen=True)
class Function:
    name: str  # the Cloud Functions name (a Cloud Run service name: lowercase and hyphens)
    entry_point: str  # the function in functions/main.py
    trigger: str  # "firestore" (jobs/{jobId} created) or a Pub/Sub topic name
    service_account: str


FUNCTIONS: tuple[Function, ...] = (
    Function("respawn-on-job-created", "on_job_created", "firestore", CONTROLLER_SA),
    Function("respawn-on-log-event", "on_log_event", LOG_EVENTS_TOPIC, CONTROLLER_SA),
    Function("respawn-on-sweep", "on_sweep", SWEEP_TOPIC, CONTROLLER_SA),
    Function("respawn-on-alert", "on_alert", ALERTS_TOPIC, NOTIFIER_SA),
)
# The Firestore trigger's document path pattern (respawn.schema.JOBS).
JOB_DOCUMENT_PATTERN = "jobs/{jobId}"
JOB_CREATED_EVENT = "google.cloud.firestore.document.v1.created"

# The VM side (owned by node_agent; deploy/vm/): what the control plane puts into node metadata `startup-script`.
STARTUP_SCRIPT = "deploy/vm/startup.sh"


def node_identity(index: int) -> str:
    """The service account ID of the pool's index-th node identity (1-based)."""
    return f"{NODE_SA}-{index}"


def node_identities(count: int) -> list[str]:
    return [node_identity(i) for i in range(1, count + 1)]


def service_accounts(identities: int = DEFAULT_NODE_IDENTITIES) -> list[str]:
    """The IDs of every service account the build makes: the controller's, the notifier's, the trigger's, and the
    node pool's `identities`."""
    return [CONTROLLER_SA, NOTIFIER_SA, TRIGGER_SA, *node_identities(identities)]


PUBSUB_AGENT_ROLE = "roles/iam.serviceAccountTokenCreator"


def pubsub_service_agent(project_number: str) -> str:
    """The email of the project's Pub/Sub service agent, which mints the trigger identity's tokens for Eventarc's
    Pub/Sub triggers (the build's `bindings` step grants it roles/iam.serviceAccountTokenCreator)."""
    return f"service-{project_number}@gcp-sa-pubsub.iam.gserviceaccount.com"


def heartbeat_database(identity: str | None) -> str:
    """The Firestore database the nodes running as `identity` (an email) write their heartbeats to, and only they:
    respawn-nodes-K for the pool's K-th identity; NODES_DATABASE for any other (a deployment without a pool)."""
    m = _NODE_IDENTITY.match(identity or "")
    return f"{NODES_DATABASE}-{m.group(1)}" if m else NODES_DATABASE


def node_firewall_rule(index: int) -> str:
    """The ingress rule of the index-th node identity."""
    return f"{NODE_FIREWALL_RULE}-{index}"


def service_account_email(account_id: str, project: str) -> str:
    return f"{account_id}@{project}.iam.gserviceaccount.com"


def source_root() -> Path:
    """The repository root, or the root of the deployed function source (deploy/stage.py keeps the same layout)."""
    return Path(__file__).resolve().parent.parent


def startup_script() -> str:
    """The node startup script's text, for metadata `startup-script`. Raises FileNotFoundError naming the path."""
    path = source_root() / STARTUP_SCRIPT
    try:
        return path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: the node startup script is missing; deploy/stage.py copies {STARTUP_SCRIPT} into the "
            "function source, so redeploy with cloudbuild.yaml (or run from a full checkout)"
        ) from None


def agent_unit(script: str | None = None) -> str:
    """The agent's systemd unit: defined once, inside the startup script that writes it on the node."""
    text = startup_script() if script is None else script
    found = re.search(r"<<'UNIT_FILE'\n(.*?\n)UNIT_FILE\n", text, re.S)
    if found is None:
        raise ValueError(f"{STARTUP_SCRIPT}: no unit between <<'UNIT_FILE' and UNIT_FILE")
    return found.group(1)


def release_artifact(bucket: str, build_id: str, name: str, sha256: str) -> str:
    """`gs://BUCKET/respawn/releases/BUILD/NAME#sha256=HEX`: what a node fetches with its own credentials and checks
    against the digest (respawn.contract.split_artifact)."""
    return f"gs://{bucket}/{RELEASES_PREFIX}/{build_id}/{name}#sha256={sha256}"
