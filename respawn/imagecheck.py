"""The CLI's look at a GPU job's boot image before `respawn jobs register` writes the job (respawn.images says
what the answer means). One Compute Engine REST GET — images.getFromFamily for projects/P/global/images/family/F,
images.get for projects/P/global/images/NAME — with the user's Application Default Credentials: google-cloud-compute
is the functions' dependency, not the CLI's. Local runs ask the sim at RESPAWN_COMPUTE_ENDPOINT, anonymously; a
run against the Firestore emulator without it has no Compute Engine to ask and looks at nothing.
"""

from __future__ import annotations

import os

import google.auth
import requests
from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
from google.auth.transport.requests import AuthorizedSession

from respawn.deployment import ENV_COMPUTE_ENDPOINT
from respawn.images import IMAGE_PATH, ImageCheck, ImageVerdict, found, image_path

PRODUCTION = "https://compute.googleapis.com"
SCOPES = ["https://www.googleapis.com/auth/compute.readonly"]
TIMEOUT_S = 15


def check(boot_image: str, project: str | None) -> ImageCheck | None:
    """What Compute Engine says of the image; None where there is nothing to ask (a local run without the sim)."""
    endpoint = os.environ.get(ENV_COMPUTE_ENDPOINT)
    if endpoint:
        session, base = requests.Session(), endpoint.rstrip("/")
    elif os.environ.get("FIRESTORE_EMULATOR_HOST"):
        return None
    else:
        try:
            credentials, default_project = google.auth.default(scopes=SCOPES)
        except DefaultCredentialsError:
            return ImageCheck(boot_image, ImageVerdict.UNCHECKED, "no Google Cloud credentials to look with")
        session, base, project = AuthorizedSession(credentials), PRODUCTION, project or default_project
    path = image_path(boot_image, project or "")
    m = IMAGE_PATH.match(path)
    if m is None or not m["project"]:
        return ImageCheck(path, ImageVerdict.UNCHECKED, "no project to look for the image in (--project)")
    what = f"family/{m['family']}" if m["family"] else m["name"]
    try:
        with session:
            r = session.get(f"{base}/compute/v1/projects/{m['project']}/global/images/{what}", timeout=TIMEOUT_S)
    except (requests.RequestException, GoogleAuthError) as exc:
        return ImageCheck(path, ImageVerdict.UNCHECKED, f"{type(exc).__name__}: {exc}"[:300])
    try:
        body = r.json()
    except ValueError:
        body = {}
    if r.status_code != 200:
        message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        if r.status_code == 404:
            return ImageCheck(path, ImageVerdict.MISSING, message or "not found")
        return ImageCheck(path, ImageVerdict.UNCHECKED, f"HTTP {r.status_code}" + (f": {message}" if message else ""))
    return found(path, str(body.get("name", "")), str((body.get("deprecated") or {}).get("state", "")))
