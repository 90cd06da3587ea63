"""Compute Engine's global resources the sim serves: images and firewall rules.

Images (global, any project): get and getFromFamily over a small table of Deep Learning VM families (IMAGE_FAMILIES,
docs/gcp-facts.md §12) plus what add_image() registers; anything else is 404 `notFound`, and so is an insert whose
boot disk names it, on the call itself, as Compute Engine answers (check_source_image).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from sim.compute_instance import BASE, NAME_RE
from sim.core import SimError, compute_error, compute_found
from sim.runtime import SimRuntime

DLVM_PROJECT = "deeplearning-platform-release"
# The Deep Learning VM families of docs/gcp-facts.md §12, each with its deprecation state as of 2026-11-23: current
# ones resolve; those past their end of patch (2026-04-13) are DEPRECATED, so their family no longer resolves while
# their image can still be named; those past their end of availability (the cu124 and older Debian 11 families) are
# absent. Image names are FAMILY-vDATE; the sim gives every family one image, of SIM_IMAGE_VERSION (the version
# date of the image Google's "Choose an image" page names as its example).
IMAGE_FAMILIES = {
    "common-cu129-ubuntu-2404-nvidia-580": "ACTIVE",
    "common-cu129-ubuntu-2204-nvidia-580": "ACTIVE",
    "pytorch-2-9-cu129-ubuntu-2404-nvidia-580": "ACTIVE",
    "pytorch-2-9-cu129-ubuntu-2204-nvidia-580": "ACTIVE",
    "common-cu128-ubuntu-2204-nvidia-570": "DEPRECATED",
    "pytorch-2-7-cu128-ubuntu-2204-nvidia-570": "DEPRECATED",
}
SIM_IMAGE_VERSION = "v20260416"
DEPRECATION_STATES = ("ACTIVE", "DEPRECATED", "OBSOLETE", "DELETED")
_SOURCE_IMAGE = re.compile(r"^(?:projects/(?P<project>[^/]+)/)?global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$")


@dataclass
class Image:
    project: str
    name: str
    family: str | None
    state: str  # DeprecationStatus.State: ACTIVE, DEPRECATED, OBSOLETE, DELETED
    id: str

    @property
    def path(self) -> str:
        return f"projects/{self.project}/global/images/{self.name}"

    def resource(self) -> dict:
        body = {"kind": "compute#image", "id": self.id, "creationTimestamp": "2026-04-16T00:00:00.000-07:00",
                "name": self.name, "status": "READY", "sourceType": "RAW", "selfLink": f"{BASE}/{self.path}"}
        if self.family:
            body["family"] = self.family
        if self.state != "ACTIVE":
            body["deprecated"] = {"state": self.state}
        return body



class GlobalResources:
    def __init__(self, rt: SimRuntime, new_id: Callable[[], str]) -> None:
        self.rt = rt
        self._new_id = new_id
        self.images: dict[tuple[str, str], Image] = {}  # (project, name) → Image
        self.firewalls: dict[tuple[str, str], dict] = {}  # (project, name) → the firewall resource
        for family, state in IMAGE_FAMILIES.items():
            self.add_image(DLVM_PROJECT, f"{family}-{SIM_IMAGE_VERSION}", family=family, deprecated=state)

    # --- images ---------------------------------------------------------------------------------------------

    def add_image(self, project: str, name: str, *, family: str | None = None, deprecated: str = "ACTIVE") -> None:
        """Make an image exist (in any project: a job's own custom image, another Deep Learning VM family)."""
        if deprecated not in DEPRECATION_STATES:
            raise SimError(f"deprecation state {deprecated!r}: use one of {', '.join(DEPRECATION_STATES)}")
        for value in (project, name, family or "a"):
            if not NAME_RE.match(value):
                raise SimError(f"{value!r} is not a Compute Engine resource name")
        with self.rt.cond:
            self.images[(project, name)] = Image(project, name, family, deprecated, self._new_id())

    # --- firewall rules (what `respawn jobs register` looks for before a multi-node job) ----------------------------

    def add_firewall(self, project: str, name: str, *, service_account: str, network: str = "default",
                     disabled: bool = False) -> None:
        """An ingress rule allowing every protocol from `service_account` to itself, as the build creates it."""
        if not NAME_RE.match(name):
            raise SimError(f"{name!r} is not a Compute Engine resource name")
        with self.rt.cond:
            self.firewalls[(project, name)] = {
                "kind": "compute#firewall", "id": self._new_id(), "name": name, "direction": "INGRESS",
                "network": f"{BASE}/projects/{project}/global/networks/{network}", "priority": 1000,
                "allowed": [{"IPProtocol": "all"}], "sourceServiceAccounts": [service_account],
                "targetServiceAccounts": [service_account], "disabled": disabled,
                "selfLink": f"{BASE}/projects/{project}/global/firewalls/{name}"}

    def get_firewall(self, project: str, name: str) -> dict:
        with self.rt.cond:
            return dict(compute_found(self.firewalls, (project, name), f"projects/{project}/global/firewalls/{name}"))

    def get_image(self, project: str, name: str) -> dict:
        with self.rt.cond:
            return compute_found(self.images, (project, name), f"projects/{project}/global/images/{name}").resource()

    def get_image_from_family(self, project: str, family: str) -> dict:
        """The newest image of the family that is not deprecated (images.getFromFamily)."""
        with self.rt.cond:
            members = [i for (p, _), i in self.images.items() if p == project and i.family == family and i.state == "ACTIVE"]
            if not members:
                raise compute_error(404, "notFound",
                                    f"The resource 'projects/{project}/global/images/family/{family}' was not found")
            return max(members, key=lambda i: i.name).resource()

    def check_source_image(self, body: dict) -> None:
        """An insert whose boot disk names an image that does not resolve answers 404 on the call, as Compute does."""
        for disk in body.get("disks") or []:
            source = (disk.get("initializeParams") or {}).get("sourceImage")
            if not source:
                continue
            path = source.split("/compute/v1/", 1)[-1]
            m = _SOURCE_IMAGE.match(path)
            if m is None:
                raise compute_error(400, "invalid", f"Invalid value for field 'resource.disks[0].initializeParams.sourceImage': "
                                    f"'{source}'. The URL is malformed.")
            project = m["project"] or self.rt.project
            if m["family"]:
                self.get_image_from_family(project, m["family"])
                continue
            image = self.get_image(project, m["name"])
            state = image.get("deprecated", {}).get("state")
            if state in ("OBSOLETE", "DELETED"):
                raise SimError(f"image {path} is {state}: the sim does not play an insert from such an image "
                               "(Compute Engine refuses it; its exact error is not recorded in docs/gcp-facts.md)")
