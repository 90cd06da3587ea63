"""A GPU job's boot image: the path a create names, what a look at it found, and how to find one that exists.

Pure. The look itself is an adapter's: the controller's (respawn.control.adapters.compute, when it first handles a
job) and the CLI's (respawn.app.imagecheck, before `respawn jobs register` writes the job). A missing image is a wrong
spec, known before any node exists; a look that could not be made (no permission on the image's project, a
transient error, no credentials) blocks nothing, and the create's own 404 then fails the job once with the same help.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .schema import GpuAccelerator

# projects/P/global/images/family/F or projects/P/global/images/NAME (gcp-facts §12).
IMAGE_PATH = re.compile(r"^projects/(?P<project>[^/]+)/global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$")
# The same, found inside an API's message (the 404 of an insert names the image it could not find).
IMAGE_MENTION = re.compile(r"projects/([a-z][a-z0-9-]*)/global/images/(family/)?([a-z][a-z0-9-]*)")
# What a REST client puts before the API's own message ("POST https://…/instances: ").
REQUEST_PREFIX = re.compile(r"^[A-Z]+ \S+: ")
# An image in one of these deprecation states cannot boot a new VM (DeprecationStatus.State, gcp-facts §12).
UNUSABLE_STATES = ("OBSOLETE", "DELETED")
DEFAULT_BOOT_IMAGE = GpuAccelerator.model_fields["boot_image"].default


class ImageVerdict(str, enum.Enum):
    FOUND = "found"
    MISSING = "missing"  # the API answered 404: no such image, or a family with no image that is not deprecated
    UNCHECKED = "unchecked"  # the check could not be made (permission, 5xx, network): go on, the create will tell


@dataclass(frozen=True)
class ImageCheck:
    image: str  # projects/P/global/images/family/F or projects/P/global/images/NAME, as the create names it
    verdict: ImageVerdict
    detail: str = ""  # FOUND: the image a family resolves to; otherwise what the API answered


def image_path(boot_image: str, project: str) -> str:
    """The boot image as the create names it: a bare NAME is an image of the job's project."""
    return boot_image if boot_image.startswith("projects/") else f"projects/{project}/global/images/{boot_image}"


def found(path: str, name: str, state: str) -> ImageCheck:
    """What an image the API returned means for a new VM: MISSING when its deprecation state refuses one."""
    if state in UNUSABLE_STATES:
        return ImageCheck(path, ImageVerdict.MISSING, f"image {name} is {state}; Compute Engine refuses new VMs from it")
    return ImageCheck(path, ImageVerdict.FOUND, name + (f" ({state})" if state else ""))


def missing_error(check: ImageCheck) -> str:
    """The field-named error for a missing image, with how to find one that exists."""
    return (f"accelerator.boot_image: {check.image} cannot boot a VM: {check.detail or 'not found'}. "
            + image_help(check.image))


def image_help(image: str) -> str:
    """How to find a boot image that exists, for a boot image path that does not (gcloud commands, default)."""
    m = IMAGE_MENTION.search(image)
    if m is None:
        return (f"set accelerator.boot_image to projects/P/global/images/family/F or projects/P/global/images/NAME "
                f"(default {DEFAULT_BOOT_IMAGE})")
    project, family, name = m.group(1), m.group(2) is not None, m.group(3)
    listing = (f'gcloud compute images list --project={project} --no-standard-images '
               f'--filter="family~^{name.split("-")[0]}"')
    if family:
        what = ("Families change with CUDA and driver releases; one whose images are all deprecated no longer "
                "resolves (--show-deprecated lists them)")
        check = f"check one with `gcloud compute images describe-from-family FAMILY --project={project}`"
    else:
        what = "An image name includes its version date, and old versions are deprecated, then removed"
        check = f"or take the newest of a family with `gcloud compute images describe-from-family FAMILY --project={project}`"
    return (f"{what}. List the current ones with `{listing}`, {check}, then set accelerator.boot_image "
            f"(default {DEFAULT_BOOT_IMAGE}) and register the job under a new id")
