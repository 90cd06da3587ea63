"""Refresh respawn/data/catalog.json (docs/job-spec.md, "The catalog"): its gcloud-derived sections are replaced from
the CSVs these commands write (any project with the Compute Engine API enabled; ';'-separated, a header line):

    gcloud compute zones list --format="csv[separator=';'](NAME,REGION)" > zones.csv
    gcloud compute machine-types list --filter="ZONE:-" \\
        --format="csv[separator=';'](NAME,CPUS,isSharedCpu,MEMORY_GB,DEPRECATED,ZONE)" > machinetypezone.csv
    gcloud compute accelerator-types list --filter="ZONE:-" --format="csv[separator=';'](NAME,ZONE)" > acceleratortypezone.csv

    python deploy/refresh_catalog.py --zones zones.csv --machine-types machinetypezone.csv \\
        --accelerator-types acceleratortypezone.csv --date YYYY-MM-DD --source "what ran them"

A file may list regions instead of zones (ZONE holding a region name): availability is kept per region either way.
The hand-checked sections (which GPUs each machine family takes, TPU zones and runtimes, the sources) are kept as
they are: edit them in the JSON, with their source, when Google's pages change. Standard library only; not part
of the installed package.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

CATALOG = Path(__file__).resolve().parent.parent / "respawn" / "data" / "catalog.json"
_ZONE = re.compile(r"^(?P<region>[a-z]+(?:-[a-z]+)*[0-9]+)-[a-z]$")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter=";"))


def _region(location: str) -> str:
    m = _ZONE.match(location)
    return m["region"] if m else location


def refresh(catalog: dict, zones: Path | None, machine_types: Path | None, accelerator_types: Path | None,
            date: str, source: str) -> dict:
    """`catalog` with the sections these files answer replaced, each dated and sourced."""
    out = dict(catalog)
    if zones is not None:
        regions: dict[str, list[str]] = {}
        for row in _rows(zones):
            regions.setdefault(row["REGION"].rsplit("/", 1)[-1], []).append(row["NAME"])
        out["regions"] = {r: sorted(z) for r, z in sorted(regions.items())}
        out["sources"]["regions"] = [{"what": source, "date": date}]
    if machine_types is not None:
        types: dict[str, dict] = {}
        where: dict[str, set[str]] = {}
        for row in _rows(machine_types):
            name = row["NAME"]
            types[name] = {"vcpus": int(row["CPUS"]), "memory_gb": float(row["MEMORY_GB"])}
            if row.get("DEPRECATED"):
                types[name]["deprecated"] = row["DEPRECATED"]
            if row.get("ZONE"):
                where.setdefault(name, set()).add(_region(row["ZONE"]))
        out["machine_types"] = dict(sorted(types.items()))
        out["machine_type_regions"] = {n: sorted(where[n]) for n in sorted(where) if n.split("-")[0] in
                                       out["regions_kept_for"]}
        out["sources"]["machine_types"] = [{"what": source, "date": date}]
    if accelerator_types is not None:
        gpus: dict[str, set[str]] = {}
        for row in _rows(accelerator_types):
            if row.get("ZONE"):
                gpus.setdefault(row["NAME"], set()).add(_region(row["ZONE"]))
        out["accelerator_regions"] = {n: sorted(r) for n, r in sorted(gpus.items())}
        out["sources"]["accelerator_regions"] = [{"what": source, "date": date}]
    out["as_of"] = date
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zones", type=Path)
    p.add_argument("--machine-types", type=Path)
    p.add_argument("--accelerator-types", type=Path)
    p.add_argument("--date", required=True)
    p.add_argument("--source", required=True, help="what produced the files (the commands, the project, when)")
    a = p.parse_args()
    catalog = json.loads(CATALOG.read_text())
    CATALOG.write_text(json.dumps(refresh(catalog, a.zones, a.machine_types, a.accelerator_types, a.date,
                                          a.source), indent=1) + "\n")


if __name__ == "__main__":
    main()
