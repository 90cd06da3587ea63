"""The one factory that builds every Google client the control plane uses, from an endpoint and credentials.

Real Google Cloud: no endpoint set; clients use their default endpoints and Application Default Credentials (the
function's service account). Local runs (tests, `respawn demo`): RESPAWN_COMPUTE_ENDPOINT / RESPAWN_TPU_ENDPOINT
(read by respawn.control.settings, like every variable of the control plane) point at sim/
("http://127.0.0.1:PORT") and FIRESTORE_EMULATOR_HOST / PUBSUB_EMULATOR_HOST at the emulators (the client libraries
read those themselves). A loopback endpoint gets anonymous credentials.

Compute's ExtendedOperation.result() would poll through an operations client that ignores client_options (so it
would leave the sim for the real API): the Compute adapter uses the `*_unary` calls and waits (zoneOperations.wait) through the
ZoneOperationsClient built here, on the same endpoint.

Every google.cloud import happens inside a method, so importing this module (and respawn.control.main) stays light.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .settings import ControlSettings


def _loopback(endpoint: str | None) -> bool:
    return bool(endpoint) and endpoint.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]"))


@dataclass(frozen=True)
class Endpoints:
    project: str
    compute: str | None = None
    tpu: str | None = None
    storage: str | None = None
    billing: str | None = None
    billing_api_key: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, settings: ControlSettings) -> "Endpoints":
        """The project and endpoints `settings` name; SettingsError when no project is set."""
        return cls(settings.require_project(), settings.compute_endpoint, settings.tpu_endpoint,
                   settings.storage_endpoint, settings.billing_endpoint, settings.billing_api_key)


class Clients:
    """Lazily built, cached, thread-safe Google clients for one set of endpoints."""

    def __init__(self, endpoints: Endpoints, credentials: Any = None):
        self.endpoints = endpoints
        self.project = endpoints.project
        self._credentials = credentials
        self._lock = threading.Lock()
        self._cache: dict[str, Any] = {}

    def _get(self, key: str, build) -> Any:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]

    def _kwargs(self, endpoint: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"transport": "rest"}
        if endpoint:
            from google.api_core.client_options import ClientOptions

            kwargs["client_options"] = ClientOptions(api_endpoint=endpoint)
        credentials = self._credentials
        if credentials is None and _loopback(endpoint):
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
        if credentials is not None:
            kwargs["credentials"] = credentials
        return kwargs

    def instances(self):
        def build():
            from google.cloud import compute_v1

            return compute_v1.InstancesClient(**self._kwargs(self.endpoints.compute))

        return self._get("instances", build)

    def zone_operations(self):
        def build():
            from google.cloud import compute_v1

            return compute_v1.ZoneOperationsClient(**self._kwargs(self.endpoints.compute))

        return self._get("zone_operations", build)

    def images(self):
        def build():
            from google.cloud import compute_v1

            return compute_v1.ImagesClient(**self._kwargs(self.endpoints.compute))

        return self._get("images", build)

    def advice(self):
        def build():
            from google.cloud import compute_v1

            return compute_v1.AdviceClient(**self._kwargs(self.endpoints.compute))

        return self._get("advice", build)

    def tpu(self):
        def build():
            from google.cloud import tpu_v2

            return tpu_v2.TpuClient(**self._kwargs(self.endpoints.tpu))

        return self._get("tpu", build)

    def firestore(self):
        def build():
            from google.cloud import firestore

            return firestore.Client(project=self.project)

        return self._get("firestore", build)

    def firestore_database(self, database: str):
        """Another Firestore database: a heartbeats' (respawn.deployment.heartbeat_database), the self-test's."""
        def build():
            from google.cloud import firestore

            return firestore.Client(project=self.project, database=database)

        return self._get(f"firestore:{database}", build)

    def _storage_session(self, endpoint: str | None = None) -> Any:
        """An HTTP session for a JSON API (Cloud Storage's unless `endpoint` names another): anonymous on a loopback
        stand-in, else authorized."""
        if self._credentials is None and _loopback(endpoint or self.endpoints.storage):
            import requests

            return requests.Session()
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials = self._credentials or google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"])[0]
        return AuthorizedSession(credentials)

    def managed_folders(self):
        """Cloud Storage managed folders and their IAM policies (the JSON API: google-cloud-storage has no call for
        them)."""
        def build():
            from .adapters.managed_folders import ManagedFoldersApi

            return ManagedFoldersApi(self._storage_session(), self.endpoints.storage)

        return self._get("managed_folders", build)

    def monitoring(self, endpoint: str | None = None):
        """Cloud Monitoring's timeSeries.create (adapters/monitoring.py; `endpoint`: the sim's in local runs)."""
        def build():
            from .adapters.monitoring import PRODUCTION, MonitoringApi

            return MonitoringApi(self._storage_session(endpoint or PRODUCTION), endpoint)

        return self._get("monitoring", build)

    def log_objects(self):
        """Cloud Storage objects.list and objects.delete for the jobs' log retention (adapters/logstore.py)."""
        def build():
            from .adapters.logstore import LogObjectsApi

            return LogObjectsApi(self._storage_session(), self.endpoints.storage)

        return self._get("log_objects", build)

    def billing_catalog(self):
        """The Cloud Billing Catalog API's services.skus.list (adapters/prices.py, gcp-facts §24): with the API key
        when one is set, else with the function's own credentials."""
        def build():
            from .adapters.prices import CatalogApi

            key = self.endpoints.billing_api_key
            if key:
                import requests

                return CatalogApi(requests.Session(), self.endpoints.billing, key)
            return CatalogApi(self._storage_session(self.endpoints.billing), self.endpoints.billing)

        return self._get("billing_catalog", build)

    def publisher(self):
        def build():
            from google.cloud import pubsub_v1

            return pubsub_v1.PublisherClient()

        return self._get("publisher", build)


_default: dict[Endpoints, Clients] = {}
_default_lock = threading.Lock()


def default(settings: ControlSettings | None = None) -> Clients:
    """The process-wide clients for the endpoints `settings` name (default: the environment, re-read on every call,
    so a test or the demo can point a running process at other endpoints)."""
    endpoints = Endpoints.of(settings if settings is not None else ControlSettings.from_env())
    with _default_lock:
        if endpoints not in _default:
            _default[endpoints] = Clients(endpoints)
        return _default[endpoints]
