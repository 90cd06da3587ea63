"""`respawn jobs register`'s look at trainer.image (issue #47): the tag resolved to a digest over the registry HTTP
API v2, so every node of the job runs the same bytes, and the image checked to exist and to run on the VM's CPU.

One GET of `/v2/NAME/manifests/REFERENCE` (Accept: the OCI index and Docker manifest list types first, then the
single manifests); the digest is the sha256 of the bytes the registry sent (its Docker-Content-Digest). An index
names its platforms; a single manifest's config blob its `architecture` and `os`.

Auth: Artifact Registry (LOCATION-docker.pkg.dev, gcr.io) with the user's Google credentials, the access token sent
as the bearer token (Google's docs, gcp-facts.md §29); any other registry anonymously, following its
`WWW-Authenticate: Bearer realm=…` challenge. https everywhere, plain http only to a registry on this machine (the
tests' stand-in). The whole look has a deadline (DEADLINE_SECONDS); every failure is a RegistryError of one line.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from respawn import oci

DEADLINE_SECONDS = 10.0
READER_ROLE = "roles/artifactregistry.reader"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(Exception):
    """One line: what failed, for which image, and what to do."""


@dataclass(frozen=True)
class Resolved:
    pinned: str  # NAME:TAG@sha256:HEX, what the job's document stores
    digest: str
    platforms: tuple[str, ...]  # os/architecture[/variant] the image offers


@dataclass
class GoogleToken:
    """An OAuth access token of the user's Google credentials and the account it is of (named in a refusal)."""
    token: str
    account: str


def google_token(deadline: float) -> GoogleToken:
    """The application-default credentials' access token (google.auth.default, cloud-platform scope)."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
    from google.auth.transport.requests import Request

    try:
        credentials, _ = google.auth.default(scopes=list(SCOPES))
        request = Request()
        credentials.refresh(lambda *a, **k: request(*a, **{**k, "timeout": max(0.1, deadline - time.monotonic())}))
    except DefaultCredentialsError:
        raise RegistryError("no Google credentials to read it with: run `gcloud auth application-default login` "
                            "(Artifact Registry serves no image anonymously)") from None
    except GoogleAuthError as exc:
        raise RegistryError(f"Google credentials refused ({' '.join(str(exc).split())[:200]}): run `gcloud auth "
                            "application-default login`") from None
    account = (getattr(credentials, "service_account_email", None) or getattr(credentials, "account", None)
               or "your application-default credentials' account")
    return GoogleToken(str(credentials.token), str(account))


class _NoAuthOnRedirect(urllib.request.HTTPRedirectHandler):
    """Blobs redirect to storage (a signed URL): the registry's token must not follow (it travels as an
    unredirected header), nor a redirect leave https."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme != "https" and urllib.parse.urlsplit(req.full_url).scheme == "https":
            return None
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_NoAuthOnRedirect)


@dataclass
class _Answer:
    status: int
    headers: Any
    body: bytes


class _Client:
    def __init__(self, ref: oci.Reference, deadline: float):
        self.ref, self.deadline = ref, deadline
        self.scheme = "http" if ref.local else "https"
        self.authorization: Optional[str] = None
        self.account: Optional[str] = None
        self.anonymous_tried = False

    def _get(self, url: str, headers: dict[str, str], authorization: Optional[str]) -> _Answer:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RegistryError(f"registry {self.ref.host} did not answer within {DEADLINE_SECONDS:g} s: check the "
                                "name and this machine's network")
        req = urllib.request.Request(url, headers=headers)
        if authorization:
            req.add_unredirected_header("Authorization", authorization)
        try:
            with _OPENER.open(req, timeout=left) as answer:
                return _Answer(answer.status, answer.headers, answer.read())
        except urllib.error.HTTPError as exc:
            return _Answer(exc.code, exc.headers, exc.read() or b"")
        except (urllib.error.URLError, OSError, socket.timeout) as exc:
            reason = getattr(exc, "reason", exc)
            timed_out = isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason)
            what = f"did not answer within {DEADLINE_SECONDS:g} s" if timed_out else f"unreachable ({reason})"
            host = urllib.parse.urlsplit(url).netloc
            raise RegistryError(f"registry {host} {what}: check the name and this machine's network") from None

    def get(self, path: str, accept: str) -> _Answer:
        """GET REGISTRY/v2/NAME/PATH, authenticating as the registry asks."""
        url = f"{self.scheme}://{self.ref.host}/v2/{self.ref.repository}/{path}"
        if self.ref.google and self.authorization is None:
            token = google_token(self.deadline)
            self.authorization, self.account = f"Bearer {token.token}", token.account
        answer = self._get(url, {"Accept": accept}, self.authorization)
        if answer.status == 401 and not self.ref.google and not self.anonymous_tried:
            self.anonymous_tried = True
            self.authorization = self._anonymous_token(answer.headers.get("WWW-Authenticate") or "")
            answer = self._get(url, {"Accept": accept}, self.authorization)
        return answer

    def _anonymous_token(self, challenge: str) -> str:
        """A pull token from the registry's token service, asked anonymously (the Bearer challenge's realm, with its
        service and scope)."""
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme != "bearer":
            raise RegistryError(f"registry {self.ref.host} asks for a password (WWW-Authenticate: {scheme or 'none'}): "
                                "Respawn reads public images there, and Artifact Registry's with your Google "
                                "credentials; push the image to Artifact Registry")
        params = dict(_CHALLENGE_PARAM.findall(challenge))
        realm = params.pop("realm", "")
        parts = urllib.parse.urlsplit(realm)
        local = (parts.hostname or "") in ("127.0.0.1", "localhost", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and local):
            raise RegistryError(f"registry {self.ref.host} sends to a token service that is not https ({realm!r})")
        params.setdefault("scope", f"repository:{self.ref.repository}:pull")
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(params)
        answer = self._get(url, {"Accept": "application/json"}, None)
        try:
            body = json.loads(answer.body) if answer.status == 200 else {}
        except ValueError:
            body = {}
        token = body.get("token") or body.get("access_token")
        if not token:
            raise RegistryError(f"registry {self.ref.host}'s token service {parts.netloc} gave no pull token for "
                                f"{self.ref.name} (HTTP {answer.status}): the repository is private or does not exist")
        return f"Bearer {token}"


def _error_codes(body: bytes) -> str:
    try:
        errors = json.loads(body).get("errors") or []
        return ", ".join(str(e.get("code")) for e in errors if isinstance(e, dict)) or ""
    except (ValueError, AttributeError):
        return ""


def _refusal(client: _Client, answer: _Answer, what: str) -> RegistryError:
    ref, codes = client.ref, _error_codes(answer.body)
    said = f" (HTTP {answer.status}{': ' + codes if codes else ''})"
    if answer.status == 404:
        if "NAME_UNKNOWN" in codes:
            return RegistryError(f"{ref.name} does not exist in {ref.registry}{said}: check the path, or push it")
        name = f"digest {ref.digest}" if ref.digest and what == "manifest" else (
            f"tag {ref.tag!r}" if what == "manifest" else what)
        return RegistryError(f"{ref.name} has no {name}{said}: push it, or name a tag or digest that exists")
    if answer.status in (401, 403):
        if ref.google:
            account = client.account or ""
            member = (f"serviceAccount:{account}" if account.endswith(".gserviceaccount.com") else
                      f"user:{account}" if "@" in account else "user:ACCOUNT")
            return RegistryError(f"access denied to {ref.name} for {account}{said}: grant it {READER_ROLE} on the "
                                 "repository (gcloud artifacts repositories add-iam-policy-binding REPOSITORY "
                                 f"--location LOCATION --member {member} --role {READER_ROLE})")
        return RegistryError(f"access denied to {ref.name} by {ref.registry}{said}: it is private; push the image to "
                             "Artifact Registry, which Respawn reads with your Google credentials")
    return RegistryError(f"registry {ref.registry} answered HTTP {answer.status} for {ref.name}"
                         f"{': ' + codes if codes else ''}: retry later")


def resolve(image: str, architecture: str, deadline_seconds: float = DEADLINE_SECONDS) -> Resolved:
    """The image pinned by digest, checked to exist and to offer linux/`architecture` (amd64 or arm64);
    RegistryError (one line, naming the image) otherwise."""
    ref = oci.parse(image)
    client = _Client(ref, time.monotonic() + deadline_seconds)
    try:
        answer = client.get(f"manifests/{ref.reference}", oci.ACCEPT)
        if answer.status != 200:
            raise _refusal(client, answer, "manifest")
        digest = "sha256:" + hashlib.sha256(answer.body).hexdigest()
        if ref.digest and digest != ref.digest:
            raise RegistryError(f"{ref.name} sent a manifest whose digest is {digest}, not {ref.digest}: retry, "
                                "or check the registry")
        try:
            manifest = json.loads(answer.body)
        except ValueError:
            raise RegistryError(f"{ref} is not an image: its manifest is not JSON") from None
        media = manifest.get("mediaType") or (answer.headers.get("Content-Type") or "").split(";")[0].strip()
        if media in oci.INDEX_TYPES or (not media and "manifests" in manifest):
            platforms = oci.index_platforms(manifest)
        elif media in oci.MANIFEST_TYPES or "config" in manifest:
            config_digest = (manifest.get("config") or {}).get("digest", "")
            blob = client.get(f"blobs/{config_digest}", "application/json, */*")
            if blob.status != 200:
                raise _refusal(client, blob, f"config blob {config_digest}")
            try:
                config = json.loads(blob.body)
            except ValueError:
                raise RegistryError(f"{ref}: its image config is not JSON") from None
            platforms = [{k: config[k] for k in ("os", "architecture", "variant") if config.get(k)}]
        else:
            raise RegistryError(f"{ref} is not a container image (manifest type {media or 'unknown'})")
    except RegistryError as exc:
        raise RegistryError(f"trainer.image {image}: {exc}") from None
    names = tuple(oci.platform_name(p) for p in platforms)
    if not oci.runs_on(platforms, architecture):
        raise RegistryError(f"trainer.image {image} is built for {', '.join(names) or 'no platform'}; the job's VMs "
                            f"are linux/{architecture}: build it for linux/{architecture} (docker buildx build "
                            f"--platform linux/{architecture})")
    return Resolved(ref.pinned(digest), digest, names)


def pin(spec: Any) -> tuple[Any, Optional[Resolved]]:
    """A JobSpec with trainer.image pinned (resolve, against the architecture of the spec's VMs), and what was
    found; the spec itself and None when it names no image. RegistryError as resolve."""
    from respawn import catalog

    if spec.trainer.image is None:
        return spec, None
    found = resolve(spec.trainer.image, catalog.architecture(spec.accelerator))
    return spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"image": found.pinned})}), found
