"""What exists, as the sim's Compute Engine and Cloud TPU API answer it: zones.get, machineTypes.get,
acceleratorTypes.get (Compute Engine v1) and the TPU API's acceleratorTypes.get, from Respawn's own offline catalog
(respawn/catalog.py), so that `respawn jobs register` against the sim is checked as against Google Cloud: 200 with
the resource where the catalog has it, 404 `notFound` where it has not. Availability is the catalog's, per region.
"""

from __future__ import annotations

from respawn import catalog
from sim.core import compute_error, rpc_error

BASE = "https://www.googleapis.com/compute/v1"


def _zone(project: str, zone: str) -> str:
    if zone not in catalog.load().zones():
        raise compute_error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
    return zone


def zone(project: str, zone: str) -> dict:
    """zones.get."""
    _zone(project, zone)
    return {"kind": "compute#zone", "name": zone, "status": "UP",
            "region": f"{BASE}/projects/{project}/regions/{catalog.region_of(zone)}",
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}"}


def machine_type(project: str, zone: str, name: str) -> dict:
    """machineTypes.get: the type where its region offers it (every region, for a series the catalog keeps no
    regions of)."""
    cat = catalog.load()
    found = cat.machine_type(name)
    regions = cat.machine_regions(name)
    if found is None or (regions is not None and catalog.region_of(_zone(project, zone)) not in regions):
        raise compute_error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/machineTypes/{name}' "
                                             "was not found")
    _zone(project, zone)
    return {"kind": "compute#machineType", "name": name, "zone": zone, "guestCpus": found["vcpus"],
            "memoryMb": int(found["memory_gb"] * 1024),
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}/machineTypes/{name}"}


def accelerator_type(project: str, zone: str, name: str) -> dict:
    """acceleratorTypes.get (a GPU)."""
    if catalog.region_of(_zone(project, zone)) not in catalog.load().gpu_regions(name):
        raise compute_error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/acceleratorTypes/"
                                             f"{name}' was not found")
    return {"kind": "compute#acceleratorType", "name": name, "zone": zone,
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}/acceleratorTypes/{name}"}


def tpu_type(project: str, zone: str, name: str) -> dict:
    """The TPU API's projects.locations.acceleratorTypes.get: a type of a generation the zone offers."""
    cat = catalog.load()
    generation = name.split("-", 1)[0]
    if cat.tpu(generation) is None or not cat.tpu_offered(generation, zone):
        raise rpc_error(404, f"Resource 'projects/{project}/locations/{zone}/acceleratorTypes/{name}' was not found")
    return {"name": f"projects/{project}/locations/{zone}/acceleratorTypes/{name}", "type": name}
