"""The control plane's configuration: one frozen object built from the environment in one place.

`ControlSettings.from_env()` reads and validates every variable the functions use (functions/README.md,
"Environment"); a bad value raises SettingsError naming the variable. Nothing else in respawn.control reads
os.environ: reconcile.Deps.default() and the handlers build one object per invocation (so a test or the demo that
changes the environment before a call is seen by that call) and pass the values down to the clients factory, the
adapters and nodespec. Standard library only (with respawn.deployment's variable names and respawn.contract's
node defaults, both standard library only themselves).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from respawn import deployment
from respawn.contract import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_NOTICE_BUDGET_SECONDS

from .observation import Settings as Policy

# The variable names (functions/README.md's table lists them with their defaults; deploy/ sets those that
# respawn.deployment names).
PROJECT_VARS = (deployment.ENV_PROJECT, "GOOGLE_CLOUD_PROJECT", "GCP_PROJECT")  # the first one set wins
COMPUTE_ENDPOINT = deployment.ENV_COMPUTE_ENDPOINT
TPU_ENDPOINT = "RESPAWN_TPU_ENDPOINT"
STORAGE_ENDPOINT = "RESPAWN_STORAGE_ENDPOINT"  # local runs only: the sim's Cloud Storage managed folders
MONITORING_ENDPOINT = "RESPAWN_MONITORING_ENDPOINT"  # local runs only: the sim's Cloud Monitoring (goodput series)
BILLING_ENDPOINT = "RESPAWN_BILLING_ENDPOINT"  # local runs only: the sim's Cloud Billing Catalog (gcp-facts §24)
BUDGET_LOOKAHEAD = "RESPAWN_BUDGET_LOOKAHEAD_SECONDS"  # observation.Settings.budget_lookahead_seconds
BILLING_API_KEY = "RESPAWN_BILLING_API_KEY"  # an API key for the Catalog API; unset: the function's own credentials
ALERTS_TOPIC = deployment.ENV_ALERTS_TOPIC
ALERT_PUBLISH_TIMEOUT = "RESPAWN_ALERT_PUBLISH_TIMEOUT_SECONDS"
SWEEP_TOPIC = deployment.ENV_SWEEP_TOPIC
SWEEP_PUBLISH_TIMEOUT = "RESPAWN_SWEEP_PUBLISH_TIMEOUT_SECONDS"
SLACK_WEBHOOK_URL = deployment.ENV_SLACK_WEBHOOK_URL
SLACK_ATTEMPTS = "RESPAWN_SLACK_ATTEMPTS"
SLACK_BACKOFF = "RESPAWN_SLACK_BACKOFF_SECONDS"
STALE_HEARTBEAT = "RESPAWN_STALE_HEARTBEAT_SECONDS"
BOOT_GRACE = "RESPAWN_BOOT_GRACE_SECONDS"
BACKOFF_BASE = "RESPAWN_BACKOFF_BASE_SECONDS"
MAX_IN_PLACE_RESTARTS = "RESPAWN_MAX_IN_PLACE_RESTARTS"
PROGRESS_TIMEOUT = "RESPAWN_PROGRESS_TIMEOUT_SECONDS"  # observation.Settings.progress_timeout_seconds; 0: off
POLL = "RESPAWN_POLL_SECONDS"
POLL_BUDGET = "RESPAWN_POLL_BUDGET_SECONDS"
OP_TIMEOUT = "RESPAWN_OP_TIMEOUT_SECONDS"
NODE_IDENTITIES = deployment.ENV_NODE_IDENTITIES
NETWORK = deployment.ENV_NETWORK
SUBNETWORK = deployment.ENV_SUBNETWORK
EXTERNAL_IP = "RESPAWN_EXTERNAL_IP"
AGENT = deployment.ENV_AGENT
LIBRARY = deployment.ENV_LIBRARY
HEARTBEAT = "RESPAWN_HEARTBEAT_SECONDS"
NOTICE_BUDGET = "RESPAWN_NOTICE_BUDGET_SECONDS"

NO_PROJECT = "no project: set RESPAWN_PROJECT (or GOOGLE_CLOUD_PROJECT) in the function's environment"


class SettingsError(RuntimeError):
    """An environment variable of the control plane has a bad value; the message names it."""


@dataclass(frozen=True)
class NodeOptions:
    """What every node is created with besides its spec: networking, identity, and what goes into its metadata."""

    # The node identity pool (respawn.control.identities): each job's nodes run as the one it holds. Empty: the
    # project's default service account ("default" for GPU VMs, the project's default for TPU VMs; local runs).
    identities: tuple[str, ...] = ()
    network: str | None = None  # None: global/networks/default for GPU VMs, the API's default for TPU VMs
    subnetwork: str | None = None
    external_ip: bool = True
    # Metadata respawn-agent and respawn-library (URI#sha256=HEX, set by deploy/); None: omitted (local runs start
    # the agent without the startup script).
    agent: str | None = None
    library: str | None = None
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS  # into respawn-settings
    notice_budget_seconds: float = DEFAULT_NOTICE_BUDGET_SECONDS  # into respawn-settings
    # Into respawn-settings: where an agent nudges the controller when its trainer or setup fails (NodeSettings);
    # ControlSettings.from_env gives it the sweep topic's value.
    sweep_topic: str | None = deployment.SWEEP_TOPIC


@dataclass(frozen=True)
class ControlSettings:
    # Clients (respawn.control.clients).
    project: str | None = None  # required by whatever talks to Google Cloud: require_project()
    compute_endpoint: str | None = None  # None: the real endpoint; sim/ in local runs
    tpu_endpoint: str | None = None
    storage_endpoint: str | None = None
    monitoring_endpoint: str | None = None  # None: https://monitoring.googleapis.com (adapters/monitoring.py)
    billing_endpoint: str | None = None  # None: https://cloudbilling.googleapis.com
    billing_api_key: str | None = field(default=None, repr=False)
    # Alerts (adapters/pubsub.py, handlers.alert).
    alerts_topic: str | None = None  # None: alerts are only logged
    alert_publish_timeout_seconds: float = 10.0
    slack_webhook_url: str | None = field(default=None, repr=False)  # a secret
    slack_attempts: int = 4
    slack_backoff_seconds: float = 1.0
    # The sweep's fan-out (handlers.sweep): one message per active job to this topic (an id in the project, or
    # projects/P/topics/T), all published at once and waited for together at most this long.
    sweep_topic: str = deployment.SWEEP_TOPIC
    sweep_publish_timeout_seconds: float = 60.0
    # Recovery policy (observation.Settings) and the reconcile loop (reconcile.Config).
    stale_heartbeat_seconds: float = Policy.stale_heartbeat_seconds
    boot_grace_seconds: float = Policy.boot_grace_seconds
    backoff_base_seconds: float = Policy.backoff_base_seconds
    max_in_place_restarts: int = Policy.max_in_place_restarts
    progress_timeout_seconds: float = Policy.progress_timeout_seconds
    budget_lookahead_seconds: float = Policy.budget_lookahead_seconds
    poll_seconds: float = 5.0
    poll_budget_seconds: float = 120.0
    # Providers (adapters/compute.py, adapters/tpu.py): one create/start/delete operation's wait.
    compute_op_timeout_seconds: float = 300.0
    tpu_op_timeout_seconds: float = 600.0
    nodes: NodeOptions = NodeOptions()

    @property
    def writes_goodput(self) -> bool:
        """Whether the controller writes jobs' goodput to Cloud Monitoring: in production always; a local run (the
        sim's Compute Engine) only where it names a Monitoring endpoint, so nothing leaves the machine."""
        return self.compute_endpoint is None or self.monitoring_endpoint is not None

    def require_project(self) -> str:
        if not self.project:
            raise SettingsError(NO_PROJECT)
        return self.project

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ControlSettings":
        """Read and validate every variable; unset or empty means the default."""
        env = _Env(os.environ if environ is None else environ)
        op_timeout = env.optional_seconds(OP_TIMEOUT, positive=True)  # one variable, each provider its own default
        sweep_topic = env.text(SWEEP_TOPIC) or cls.sweep_topic
        return cls(
            project=next((env.text(name) for name in PROJECT_VARS if env.text(name)), None),
            compute_endpoint=env.text(COMPUTE_ENDPOINT),
            tpu_endpoint=env.text(TPU_ENDPOINT),
            storage_endpoint=env.text(STORAGE_ENDPOINT),
            monitoring_endpoint=env.text(MONITORING_ENDPOINT),
            billing_endpoint=env.text(BILLING_ENDPOINT),
            billing_api_key=env.text(BILLING_API_KEY),
            alerts_topic=env.text(ALERTS_TOPIC),
            alert_publish_timeout_seconds=env.seconds(ALERT_PUBLISH_TIMEOUT, cls.alert_publish_timeout_seconds, positive=True),
            slack_webhook_url=env.text(SLACK_WEBHOOK_URL),
            slack_attempts=env.count(SLACK_ATTEMPTS, cls.slack_attempts, minimum=1),
            slack_backoff_seconds=env.seconds(SLACK_BACKOFF, cls.slack_backoff_seconds),
            sweep_topic=sweep_topic,
            sweep_publish_timeout_seconds=env.seconds(SWEEP_PUBLISH_TIMEOUT, cls.sweep_publish_timeout_seconds,
                                                      positive=True),
            stale_heartbeat_seconds=env.seconds(STALE_HEARTBEAT, cls.stale_heartbeat_seconds, positive=True),
            boot_grace_seconds=env.seconds(BOOT_GRACE, cls.boot_grace_seconds),
            backoff_base_seconds=env.seconds(BACKOFF_BASE, cls.backoff_base_seconds),
            max_in_place_restarts=env.count(MAX_IN_PLACE_RESTARTS, cls.max_in_place_restarts, minimum=0),
            progress_timeout_seconds=env.seconds(PROGRESS_TIMEOUT, cls.progress_timeout_seconds),
            budget_lookahead_seconds=env.seconds(BUDGET_LOOKAHEAD, cls.budget_lookahead_seconds),
            poll_seconds=env.seconds(POLL, cls.poll_seconds, positive=True),
            poll_budget_seconds=env.seconds(POLL_BUDGET, cls.poll_budget_seconds),
            compute_op_timeout_seconds=cls.compute_op_timeout_seconds if op_timeout is None else op_timeout,
            tpu_op_timeout_seconds=cls.tpu_op_timeout_seconds if op_timeout is None else op_timeout,
            nodes=NodeOptions(
                identities=env.emails(NODE_IDENTITIES),
                network=env.text(NETWORK),
                subnetwork=env.text(SUBNETWORK),
                external_ip=env.flag(EXTERNAL_IP, NodeOptions.external_ip),
                agent=env.text(AGENT),
                library=env.text(LIBRARY),
                heartbeat_seconds=env.seconds(HEARTBEAT, DEFAULT_HEARTBEAT_SECONDS, positive=True),
                notice_budget_seconds=env.seconds(NOTICE_BUDGET, DEFAULT_NOTICE_BUDGET_SECONDS, positive=True),
                sweep_topic=sweep_topic,
            ),
        )


_EMAIL = re.compile(r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$")


class _Env:
    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ

    def text(self, name: str) -> str | None:
        return self.environ.get(name) or None

    def _bad(self, name: str, raw: str, what: str) -> SettingsError:
        return SettingsError(f"{name}={raw!r} is not {what}; fix the function's environment")

    def seconds(self, name: str, default: float, *, positive: bool = False) -> float:
        value = self.optional_seconds(name, positive=positive)
        return default if value is None else value

    def optional_seconds(self, name: str, *, positive: bool = False) -> float | None:
        raw = self.text(name)
        if raw is None:
            return None
        what = "a positive number of seconds" if positive else "a number of seconds (0 or more)"
        try:
            value = float(raw)
        except ValueError:
            raise self._bad(name, raw, what) from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise self._bad(name, raw, what)
        return value

    def count(self, name: str, default: int, *, minimum: int) -> int:
        raw = self.text(name)
        if raw is None:
            return default
        what = f"a whole number ≥ {minimum}"
        try:
            value = float(raw)
        except ValueError:
            raise self._bad(name, raw, what) from None
        if not value.is_integer() or value < minimum:
            raise self._bad(name, raw, what)
        return int(value)

    def emails(self, name: str) -> tuple[str, ...]:
        """A comma-separated list of service account emails, each once."""
        raw = self.text(name)
        if raw is None:
            return ()
        emails = tuple(e.strip() for e in raw.split(","))
        if any(not _EMAIL.match(e) for e in emails) or len(set(emails)) != len(emails):
            raise self._bad(name, raw, "a comma-separated list of distinct service account emails")
        return emails

    def flag(self, name: str, default: bool) -> bool:
        raw = self.text(name)
        if raw is None:
            return default
        word = raw.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
        raise self._bad(name, raw, "1 or 0 (true/false, yes/no, on/off)")
