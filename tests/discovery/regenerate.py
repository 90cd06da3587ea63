"""Vendor Google's discovery documents, trimmed to the methods Respawn calls or sim/ serves and the schemas those
reach ($ref closure), for tests/discovery_schema.py.

    python tests/discovery/regenerate.py google_api_python_client-2.202.0-py3-none-any.whl

The documents come from the wheel of google-api-python-client (googleapiclient/discovery_cache/documents/), which
is not installed: `pip download google-api-python-client==VERSION --no-deps -d DIR`. Each trimmed copy keeps the
document's own `revision` and says where it came from and when (`x-vendored`). A method added to METHODS is vendored
on the next run; tests/test_discovery_bodies.py names the methods it needs.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSIDE = "googleapiclient/discovery_cache/documents/"

# Per document: the method ids kept (as the document names them).
METHODS = {
    "compute.v1": [
        "compute.instances.insert", "compute.instances.list", "compute.instances.get", "compute.instances.delete",
        "compute.instances.start", "compute.instances.stop", "compute.instances.setMetadata",
        "compute.instances.simulateMaintenanceEvent", "compute.instances.getSerialPortOutput",
        "compute.zoneOperations.list", "compute.zoneOperations.get", "compute.zoneOperations.wait",
        "compute.images.get", "compute.images.getFromFamily", "compute.advice.capacity",
        "compute.advice.capacityHistory", "compute.regions.get", "compute.firewalls.get", "compute.zones.get",
        "compute.machineTypes.get", "compute.acceleratorTypes.get",
    ],
    "tpu.v2": [
        "tpu.projects.locations.nodes.create", "tpu.projects.locations.nodes.list", "tpu.projects.locations.nodes.get",
        "tpu.projects.locations.nodes.delete", "tpu.projects.locations.nodes.patch",
        "tpu.projects.locations.operations.get", "tpu.projects.locations.queuedResources.create",
        "tpu.projects.locations.queuedResources.list", "tpu.projects.locations.queuedResources.get",
        "tpu.projects.locations.queuedResources.delete", "tpu.projects.locations.acceleratorTypes.get",
    ],
    "storage.v1": [
        "storage.managedFolders.insert", "storage.managedFolders.getIamPolicy", "storage.managedFolders.setIamPolicy",
        "storage.objects.get", "storage.objects.insert", "storage.objects.list", "storage.objects.delete",
    ],
    "logging.v2": ["logging.entries.write", "logging.projects.sinks.create", "logging.projects.sinks.get",
                   "logging.projects.sinks.update", "logging.projects.sinks.delete"],
    "cloudscheduler.v1": ["cloudscheduler.projects.locations.jobs.run", "cloudscheduler.projects.locations.jobs.get",
                          "cloudscheduler.projects.locations.jobs.pause",
                          "cloudscheduler.projects.locations.jobs.resume"],
    "cloudbilling.v1": ["cloudbilling.services.skus.list"],
    "monitoring.v3": ["monitoring.projects.timeSeries.create"],
    "pubsub.v1": ["pubsub.projects.topics.publish"],
    "firestore.v1": ["firestore.projects.databases.documents.commit", "firestore.projects.databases.documents.get",
                     # `respawn doctor`'s list of the composite indexes, and the calls that break and mend them
                     "firestore.projects.databases.collectionGroups.indexes.list",
                     "firestore.projects.databases.collectionGroups.indexes.create",
                     "firestore.projects.databases.collectionGroups.indexes.get",
                     "firestore.projects.databases.collectionGroups.indexes.delete"],
    # What the build hands gcloud as files: the custom roles (`gcloud iam roles create|update --file`; the service
    # accounts are `respawn doctor`'s reads, below) and the
    # goodput dashboard (`gcloud monitoring dashboards create|update --config-from-file`).
    "iam.v1": ["iam.projects.roles.create", "iam.projects.roles.patch", "iam.projects.serviceAccounts.get",
               "iam.projects.serviceAccounts.create", "iam.projects.serviceAccounts.delete"],
    "serviceusage.v1": ["serviceusage.services.list", "serviceusage.services.enable",
                        "serviceusage.services.disable"],
    "cloudresourcemanager.v1": ["cloudresourcemanager.projects.get", "cloudresourcemanager.projects.getIamPolicy",
                                "cloudresourcemanager.projects.setIamPolicy"],
    "secretmanager.v1": ["secretmanager.projects.secrets.versions.get",
                         "secretmanager.projects.secrets.versions.enable",
                         "secretmanager.projects.secrets.versions.disable"],
    "monitoring.v1": ["monitoring.projects.dashboards.create", "monitoring.projects.dashboards.patch"],
}
TOP_LEVEL = ("kind", "id", "name", "version", "revision", "title", "rootUrl", "servicePath", "basePath", "parameters")


def _methods(resources: dict, keep: set[str]) -> dict:
    """The resource tree holding only the kept methods."""
    out = {}
    for name, resource in resources.items():
        methods = {k: v for k, v in resource.get("methods", {}).items() if v["id"] in keep}
        children = _methods(resource.get("resources", {}), keep)
        if methods or children:
            out[name] = {**({"methods": methods} if methods else {}), **({"resources": children} if children else {})}
    return out


def _refs(value) -> set[str]:
    return set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(value)))


def trim(doc: dict, keep: list[str], source: str) -> dict:
    resources = _methods(doc["resources"], set(keep))
    found = set(re.findall(r'"id": "([^"]+)"', json.dumps(resources)))
    missing = sorted(set(keep) - found)
    if missing:
        raise SystemExit(f"{doc['id']} rev {doc['revision']} has no method {', '.join(missing)}")
    names, todo = set(), _refs(resources)
    while todo:
        name = todo.pop()
        if name not in names:
            names.add(name)
            todo |= _refs(doc["schemas"][name])
    return {**{k: doc[k] for k in TOP_LEVEL if k in doc},
            "x-vendored": {"from": source, "on": date.today().isoformat(), "methods": sorted(keep)},
            "resources": resources, "schemas": {k: doc["schemas"][k] for k in sorted(names)}}


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        for api, keep in METHODS.items():
            doc = json.loads(z.read(f"{INSIDE}{api}.json"))
            trimmed = trim(doc, keep, f"{Path(wheel).name}:{INSIDE}{api}.json")
            (HERE / f"{api}.json").write_text(json.dumps(trimmed, indent=1, sort_keys=True) + "\n")
            print(f"{api} rev {doc['revision']}: {len(keep)} methods, {len(trimmed['schemas'])} schemas")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/discovery/regenerate.py "
                         "google_api_python_client-VERSION-py3-none-any.whl")
    main(sys.argv[1])
