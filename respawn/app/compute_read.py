"""The CLI's read-only look at Compute Engine (before `respawn jobs register` writes a job, and `respawn zones`):
REST reads with the user's Application Default Credentials (google-cloud-compute is the functions' dependency, not
the CLI's). Local runs ask the sim at RESPAWN_COMPUTE_ENDPOINT, anonymously; a run against the Firestore emulator without it has no Compute
Engine to ask and looks at nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import google.auth
import requests
from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
from google.auth.transport.requests import AuthorizedSession

from respawn.deployment import ENV_COMPUTE_ENDPOINT

from . import endpoints

PRODUCTION = "https://compute.googleapis.com"
# advice.capacity and advice.capacityHistory accept only cloud-platform or compute, not compute.readonly
# (docs/gcp-facts.md §20); what may be read is IAM's to say (roles/compute.viewer), not the scope's.
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# Each request's deadline, to connect and for each read (requests retries nothing): a hung endpoint ends the command
# within 10 s, and is not asked again in this process (_silent), however many looks the command makes.
TIMEOUT_S = endpoints.CALL_DEADLINE_S
_silent: dict[str, str] = {}  # an API's base URL → the line saying it stopped answering


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no answer (`problem` says why)
    body: dict
    problem: str = ""

    @property
    def message(self) -> str:
        return str((self.body.get("error") or {}).get("message") or "")


@dataclass(frozen=True)
class Reader:
    session: requests.Session
    base: str
    project: str | None  # the --project given, else the credentials' default project

    def get(self, path: str) -> Answer:
        """GET {base}/compute/v1/{path}; a failure to ask is an Answer with no status."""
        return self.ask("GET", self.base, f"compute/v1/{path}", None, endpoints.COMPUTE)

    def post(self, path: str, body: dict) -> Answer:
        """POST {base}/compute/v1/{path} with a JSON body (a read that takes one: advice.capacity)."""
        return self.ask("POST", self.base, f"compute/v1/{path}", body, endpoints.COMPUTE)

    def ask(self, method: str, base: str, path: str, body: dict | None, service: endpoints.Service) -> Answer:
        """{method} {base}/{path} (another API's base: Cloud TPU's) with this session's credentials, within
        TIMEOUT_S; an API that let one request run past it is not asked again."""
        if base in _silent:
            return Answer(None, {}, _silent[base])
        try:
            r = self.session.request(method, f"{base}/{path}", json=body, timeout=TIMEOUT_S)
        except requests.Timeout:
            _silent[base] = endpoints.unanswered(service, endpoints.late(TIMEOUT_S), self.project)
            return Answer(None, {}, _silent[base])
        except (requests.RequestException, GoogleAuthError) as exc:
            return Answer(None, {}, f"{type(exc).__name__}: {exc}"[:300])
        try:
            body = r.json()
        except ValueError:
            body = {}
        return Answer(r.status_code, body if isinstance(body, dict) else {})


def reader(project: str | None) -> Reader | str | None:
    """Where to look: a Reader; a reason why no look can be made (no credentials, an endpoint that does not answer);
    None where there is nothing to ask (a local run without the sim)."""
    endpoint = os.environ.get(ENV_COMPUTE_ENDPOINT)
    if endpoint:
        try:  # the sim, stopped or hung: said in seconds, not after TIMEOUT_S a request (requests retries nothing)
            endpoints.check(endpoints.COMPUTE)
        except endpoints.Unreachable as exc:
            return str(exc)
        return Reader(requests.Session(), endpoint.rstrip("/"), project)
    if os.environ.get("FIRESTORE_EMULATOR_HOST"):
        return None
    try:
        credentials, default_project = google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError:
        return "no Google Cloud credentials to look with"
    try:  # said in seconds, not after a request's TIMEOUT_S
        endpoints.check(endpoints.COMPUTE, project or default_project)
    except endpoints.Unreachable as exc:
        return str(exc)
    return Reader(AuthorizedSession(credentials), PRODUCTION, project or default_project)
