"""OCI image references (`trainer.image`, issue #47): their syntax, the registry that serves them, and what an image
index or manifest says of the platforms it runs on.

A reference is `[REGISTRY/]PATH[:TAG][@sha256:HEX]`, read as Docker reads it: the first part of the path is a
registry host when it has a `.` or a `:` or is `localhost`; otherwise the registry is Docker Hub (`docker.io`, with
`library/` before a one-part path). A reference that cannot exist is a BadReference with one line saying why.
The stored form of a job's image is pinned by digest (respawn.contract.IMAGE_PINNED): `REGISTRY/PATH:TAG@sha256:HEX`.

Pure: the standard library only; respawn.app.registry asks the registries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .contract import IMAGE_PINNED

DEFAULT_REGISTRY = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's registry API answers
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")  # the only registries reached over plain http

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES)

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_HOST = re.compile(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
                   r"(?::[0-9]+)?$|^\[::1\](?::[0-9]+)?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_NAME = 255


class BadReference(ValueError):
    """A reference that cannot name an image: one line, what is wrong and the form expected."""


@dataclass(frozen=True)
class Reference:
    registry: str  # as the pinned form writes it: docker.io, us-docker.pkg.dev, 127.0.0.1:5000
    repository: str  # the path: library/python, my-project/my-repo/trainer
    tag: Optional[str] = None
    digest: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What the registry's manifests endpoint is asked for: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def host(self) -> str:
        """The registry's address for its HTTP API (docker.io answers at registry-1.docker.io)."""
        return DOCKER_HUB_API if self.registry == DEFAULT_REGISTRY else self.registry

    @property
    def local(self) -> bool:
        """A registry on this machine: the only kind asked over plain http."""
        host = self.registry.split("]")[0] + "]" if self.registry.startswith("[") else self.registry.split(":")[0]
        return host in LOCAL_HOSTS

    @property
    def google(self) -> bool:
        """Artifact Registry (LOCATION-docker.pkg.dev, and gcr.io's hosts it serves): read with Google credentials."""
        host = self.registry.split(":", 1)[0]
        return host.endswith("-docker.pkg.dev") or host == "gcr.io" or host.endswith(".gcr.io")

    def pinned(self, digest: str) -> str:
        """The stored form: NAME[:TAG]@DIGEST (the tag kept for people; the digest decides what runs)."""
        out = f"{self.name}:{self.tag}@{digest}" if self.tag else f"{self.name}@{digest}"
        assert IMAGE_PINNED.match(out), out
        return out

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse(text: Any) -> Reference:
    """The reference `text` names, tag `latest` when it gives neither tag nor digest; BadReference when it cannot
    name an image."""
    if not isinstance(text, str) or not text.strip():
        raise BadReference("must be an image reference such as us-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG")
    if text != text.strip() or any(c.isspace() for c in text):
        raise BadReference(f"{text!r} has spaces: one reference, such as REGISTRY/PATH:TAG")
    if "://" in text:
        raise BadReference(f"{text!r}: no scheme; write REGISTRY/PATH:TAG, e.g. {text.split('://', 1)[1]}")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise BadReference(f"{text!r}: the digest after @ must be sha256: and 64 lowercase hex digits")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest[:len(rest) - len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
        if not _TAG.match(tag):
            raise BadReference(f"{text!r}: {tag!r} is not a tag (letters, digits, _ . -, at most 128, not starting "
                               "with . or -)")
    parts = rest.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry, path = parts[0], parts[1:]
        if not _HOST.match(registry):
            raise BadReference(f"{text!r}: {registry!r} is not a registry host (HOST or HOST:PORT)")
        registry = registry.lower()
    else:
        registry, path = DEFAULT_REGISTRY, parts
        if len(parts) == 1 and "." in parts[0] and not tag and not digest:
            raise BadReference(f"{text!r} names a registry host but no image: write {text}/PATH/IMAGE:TAG")
        if len(path) == 1:
            path = ["library", *path]
    if not path or any(p == "" for p in path):
        raise BadReference(f"{text!r}: an empty path component; write REGISTRY/PATH:TAG")
    for p in path:
        if p != p.lower() and _COMPONENT.match(p.lower()):
            raise BadReference(f"{text!r}: repository names are lower case ({'/'.join(path).lower()})")
        if not _COMPONENT.match(p):
            raise BadReference(f"{text!r}: {p!r} is not a repository path component (lower-case letters and digits, "
                               "separated by . _ __ or -)")
    repository = "/".join(path)
    if registry.split(":", 1)[0].endswith("-docker.pkg.dev") and len(path) < 3:
        raise BadReference(f"{text!r}: an Artifact Registry image is {registry}/PROJECT/REPOSITORY/IMAGE")
    if len(registry) + 1 + len(repository) > MAX_NAME:
        raise BadReference(f"{text!r}: the name is longer than the {MAX_NAME} characters a registry allows")
    return Reference(registry, repository, tag if tag or digest else "latest", digest)


def platform_name(platform: dict) -> str:
    """os/architecture[/variant], as Docker writes a platform: linux/arm64/v8."""
    parts = [str(platform.get("os", "?")), str(platform.get("architecture", "?"))]
    if platform.get("variant"):
        parts.append(str(platform["variant"]))
    return "/".join(parts)


def index_platforms(index: dict) -> list[dict]:
    """The platforms an image index (or Docker manifest list) offers, leaving out attestation entries
    (unknown/unknown)."""
    out = []
    for entry in index.get("manifests") or []:
        platform = entry.get("platform") or {}
        if platform.get("os") == "unknown" or platform.get("architecture") == "unknown":
            continue
        out.append(platform)
    return out


def runs_on(platforms: list[dict], architecture: str) -> bool:
    """Whether one of `platforms` is linux on `architecture` (amd64 or arm64)."""
    return any(p.get("os") == "linux" and p.get("architecture") == architecture for p in platforms)
