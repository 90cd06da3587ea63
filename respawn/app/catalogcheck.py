"""The CLI's live look at what exists, before `respawn jobs register` writes a job (respawn.catalog says what the
answers mean): per zone of the job, Compute Engine's zones.get, machineTypes.get and acceleratorTypes.get through
respawn.app.compute_read (the user's credentials), and the Cloud TPU API's acceleratorTypes.get. 200 is "exists", 404
"does not"; anything else (no permission, no network) is no answer, and the offline catalog decides.
"""

from __future__ import annotations

import os
from typing import Optional

from respawn.catalog import Live
from respawn.deployment import ENV_COMPUTE_ENDPOINT

from . import endpoints
from .compute_read import Reader, reader

TPU_PRODUCTION = "https://tpu.googleapis.com"
ENV_TPU_ENDPOINT = "RESPAWN_TPU_ENDPOINT"  # local runs: the sim's Cloud TPU API (functions/settings.py's too)
_COMPUTE_PATHS = {"zone": "zones/{zone}", "machine": "zones/{zone}/machineTypes/{name}",
                  "gpu": "zones/{zone}/acceleratorTypes/{name}"}


def _tpu_base() -> str:
    return (os.environ.get(ENV_TPU_ENDPOINT) or os.environ.get(ENV_COMPUTE_ENDPOINT) or TPU_PRODUCTION).rstrip("/")


def _verdict(status: int | None, message: str, name: str) -> Optional[bool]:
    """200: it exists; a 404 naming it: it does not (a 404 about something else, such as the project, says
    nothing of it)."""
    return True if status == 200 else False if status == 404 and name in message else None


def live(project: str | None) -> tuple[Live | None, str]:
    """What the APIs say exists, and why nothing can be asked ("" where it can, or where there is nothing to ask:
    a local run without the sim)."""
    look = reader(project)
    if look is None:
        return None, ""
    if not isinstance(look, Reader):
        return None, look
    if not look.project:
        return None, "no project to ask in (--project)"
    seen: dict[tuple[str, str, str], Optional[bool]] = {}

    def ask(kind: str, name: str, zone: str) -> Optional[bool]:
        key = (kind, name, zone)
        if key not in seen:
            seen[key] = _ask(look, kind, name, zone)
        return seen[key]

    return ask, ""


def _ask(look: Reader, kind: str, name: str, zone: str) -> Optional[bool]:
    if kind == "zone":
        name, zone = "", name
    if kind in _COMPUTE_PATHS:
        path = _COMPUTE_PATHS[kind].format(zone=zone, name=name)
        answer = look.get(f"projects/{look.project}/{path}")
        return _verdict(answer.status, answer.message, path)
    path = f"locations/{zone}/acceleratorTypes/{name}"
    base = _tpu_base()
    if base == TPU_PRODUCTION:
        try:  # the real API probed first, as Compute Engine's is (compute_read.reader)
            endpoints.check(endpoints.TPU, look.project)
        except endpoints.Unreachable:
            return None  # no answer: the catalog decides
    answer = look.ask("GET", base, f"v2/projects/{look.project}/{path}", None, endpoints.TPU)
    return _verdict(answer.status, answer.message, path)
