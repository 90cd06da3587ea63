"""What exists on Google Cloud, as a job spec is checked against it: the dated, sourced offline catalog
(respawn/data/catalog.json; docs/job-spec.md, "The catalog") and the questions Respawn asks of it.

`problems(spec)` is every way a valid-looking spec names something that does not exist: a zone, a machine type, a GPU,
a GPU on a machine family that does not take it, a machine or GPU in a region without it, a TPU type or runtime where
there is none. Each is one line naming the field, the value and the fix ("did you mean g2-standard-8?"). A `Live`
answer (the APIs, with credentials: respawn.app.catalogcheck) is preferred to the catalog's where it has one.

Pure: the standard library only (the spec is read by its attributes), so the CLI, sim/ and tests share it.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional

PATH = Path(__file__).with_name("data") / "catalog.json"
# TensorFlow's TPU runtimes (tpu-vm-tf-X.Y.Z[-pod][-pjrt|-se]) run on every generation (docs/gcp-facts.md §28).
_TF_RUNTIME = re.compile(r"^tpu-vm-tf-[0-9]")
# A TPU type's generation: v5litepod-16 → v5litepod.
_TPU = re.compile(r"^(?P<gen>v[0-9][a-z0-9]*)-(?P<size>[0-9]+)$")

# A live answer to "does NAME exist in ZONE?" for kind "machine" (machineTypes.get), "gpu" (acceleratorTypes.get)
# or "tpu" (the TPU API's acceleratorTypes.get): True, False, or None where it could not be asked.
Live = Callable[[str, str, str], Optional[bool]]


@dataclass(frozen=True)
class Catalog:
    data: dict[str, Any]

    @property
    def as_of(self) -> str:
        return self.data["as_of"]

    def zones(self) -> dict[str, str]:
        """zone → region, the TPU-only zones included."""
        out = {z: r for r, zs in self.data["regions"].items() for z in zs}
        out.update({z: region_of(z) for z in self.data.get("tpu_only_zones", {})})
        return out

    def machine_type(self, name: str) -> dict[str, Any] | None:
        return self.data["machine_types"].get(name)

    def machine_regions(self, name: str) -> list[str] | None:
        """The regions offering `name`; None where the catalog keeps no regions for its series."""
        return self.data["machine_type_regions"].get(name)

    def built_in(self, machine_type: str) -> str | None:
        """The GPU a machine type has built in (g2-standard-8 → nvidia-l4), or None."""
        for family, gpu in self.data["built_in"].items():
            if machine_type.startswith(family + "-"):
                return gpu
        return None

    def gpus(self) -> list[str]:
        return sorted(g for g in self.data["accelerator_regions"] if g.startswith("nvidia-"))

    def gpu_regions(self, gpu: str) -> list[str]:
        return self.data["accelerator_regions"].get(gpu, [])

    def machines_with(self, gpu: str) -> list[str]:
        """The machine types with `gpu` built in, smallest first."""
        names = [n for n in self.data["machine_types"] if self.built_in(n) == gpu]
        return sorted(names, key=lambda n: (self.data["machine_types"][n]["vcpus"], n))

    def tpu(self, generation: str) -> dict[str, Any] | None:
        return self.data["tpus"].get(generation)

    def tpu_offered(self, generation: str, zone: str) -> bool:
        """A TPU generation in a zone: listed there, or listed in its region where no zone of the region is."""
        t = self.data["tpus"][generation]
        if zone in t["zones"]:
            return True
        region = region_of(zone)
        return region in t["regions"] and not any(region_of(z) == region for z in t["zones"])


def architecture(accelerator: Any) -> str:
    """The CPU architecture of the job's VMs as OCI platforms name it, amd64 or arm64: a GPU VM's from its machine
    series (the catalog's arm64_series: A4X, C4A, …), a TPU VM host's from tpu_host_architecture."""
    data = load().data
    if accelerator.kind == "tpu":
        return data["tpu_host_architecture"]
    series = accelerator.machine_type.split("-", 1)[0]
    return "arm64" if series in data["arm64_series"] else "amd64"


@lru_cache(maxsize=1)
def load() -> Catalog:
    return Catalog(json.loads(PATH.read_text()))


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _suggest(value: str, candidates: Any) -> str:
    """"; did you mean X?" for a near miss; for none, where the answer comes from (a name newer than the catalog
    passes `respawn jobs register`, which asks the APIs)."""
    close = difflib.get_close_matches(value, list(candidates), n=1, cutoff=0.75)
    return (f"; did you mean {close[0]}?" if close else
            f" (Respawn's catalog of {load().as_of}; `respawn jobs register` asks Google Cloud where it can)")


def _listed(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def problems(spec: Any, live: Live | None = None) -> list[str]:
    """Every name in `spec` (a respawn.schema.JobSpec) that does not exist where the spec puts it, one line each
    (`field: what is wrong; the fix`). `live` answers are preferred where given."""
    cat = load()
    zones = cat.zones()
    out: list[str] = []
    known_zones = []
    acc = spec.accelerator
    for i, zone in enumerate(spec.zones):
        # A TPU zone is asked about with its type (the TPU API's answer); us-central2-b, v4's, is no zone of
        # Compute Engine's for most projects.
        said = _exists(live, "zone", zone, "") if acc.kind == "gpu" else None
        if said or (said is None and zone in zones):
            known_zones.append((i, zone))
            continue
        region = region_of(zone)
        here = cat.data["regions"].get(region)
        fix = (f"{region} has {', '.join(here)}" if here else
               "`gcloud compute zones list` lists them" + _suggest(zone, zones))
        out.append(f"zones[{i}]: {zone} is not a Google Cloud zone; {fix}")
    if acc.kind == "gpu":
        out += _gpu_problems(cat, acc, known_zones, live)
    else:
        out += _tpu_problems(cat, acc, known_zones, live)
    return out


def _exists(live: Live, kind: str, name: str, zone: str) -> bool | None:
    return live(kind, name, zone) if live is not None else None


def _gpu_problems(cat: Catalog, acc: Any, zones: list[tuple[int, str]], live: Live | None) -> list[str]:
    out: list[str] = []
    machine, gpu = acc.machine_type, acc.accelerator_type
    if cat.machine_type(machine) is None and not any(_exists(live, "machine", machine, z) for _, z in zones):
        return [f"accelerator.machine_type: {machine} is not a Compute Engine machine type"
                f"{_suggest(machine, cat.data['machine_types'])}"]
    built_in = cat.built_in(machine)
    if gpu is not None:
        if gpu not in cat.data["accelerator_regions"] and not any(_exists(live, "gpu", gpu, z) for _, z in zones):
            return [f"accelerator.accelerator_type: {gpu} is not a Compute Engine GPU{_suggest(gpu, cat.gpus())}"]
        if built_in is not None and gpu != built_in:
            return [f"accelerator.accelerator_type: {machine} has its {built_in} built in; leave accelerator_type "
                    "out"]
        if built_in is None and not machine.startswith("n1-"):
            return [f"accelerator.accelerator_type: GPUs attach to N1 machine types only, not {machine}; use "
                    f"n1-standard-8 with {gpu}, or a machine type with GPUs built in"]
        if built_in is None and gpu not in cat.data["attach_to_n1"]:
            homes = cat.machines_with(gpu)
            fix = (f"use a machine type with it built in, such as {homes[0]}, and leave accelerator_type out" if homes
                   else "attach a GPU N1 takes (nvidia-tesla-t4, -v100, -p100, -p4)")
            return [f"accelerator.accelerator_type: {gpu} does not attach to {machine} (N1 takes T4, V100, P100 and "
                    f"P4 only); {fix}"]
    what = gpu or built_in
    for i, zone in zones:
        region = region_of(zone)
        # The machine type (machineTypes.get), and an attached GPU (acceleratorTypes.get): what Compute Engine says
        # of each, else the catalog's per-region answer.
        said = {"machine": _exists(live, "machine", machine, zone), "gpu": _exists(live, "gpu", gpu, zone) if gpu
                else None}
        refused = [name for kind, name in (("machine", machine), ("gpu", gpu)) if said[kind] is False]
        if refused:
            out.append(f"zones[{i}]: {zone} does not offer {' with '.join(refused)} (Compute Engine says so): drop it")
            continue
        machine_regions = cat.machine_regions(machine)
        if said["machine"] is None and machine_regions is not None and region not in machine_regions:
            out.append(f"zones[{i}]: {machine} is not offered in {region}{_where(machine_regions)}")
        # A built-in GPU the accelerator list does not name (A4X Max's GB300, on bare-metal machines only) goes
        # where its machine type goes: checked above.
        elif what and (said["gpu"] if gpu else said["machine"]) is None and cat.gpu_regions(what) \
                and region not in cat.gpu_regions(what):
            out.append(f"zones[{i}]: {region} has no {what}{_where(cat.gpu_regions(what))}")
    return out


def _where(regions: list[str]) -> str:
    return f"; it is in {_listed(regions)} (docs/job-spec.md, The catalog)" if regions else ""


def _tpu_problems(cat: Catalog, acc: Any, zones: list[tuple[int, str]], live: Live | None) -> list[str]:
    m = _TPU.match(acc.accelerator_type)
    generation = m["gen"] if m else acc.accelerator_type
    tpu = cat.tpu(generation)
    if tpu is None:
        return [f"accelerator.accelerator_type: {acc.accelerator_type}: no TPU generation {generation}"
                f"{_suggest(generation, cat.data['tpus'])} (Respawn runs v6e, v5p, v5litepod, v4, v3, v2)"]
    out = []
    runtime = acc.runtime_version
    runtimes: dict[str, list[str]] = {}
    for g, t in cat.data["tpus"].items():
        runtimes.setdefault(t["runtime"], []).append(g)
    if runtime != tpu["runtime"] and not _TF_RUNTIME.match(runtime):
        if runtime in runtimes:
            out.append(f"accelerator.runtime_version: {runtime} is the runtime of {', '.join(runtimes[runtime])}; "
                       f"{generation} runs {tpu['runtime']}")
        elif difflib.get_close_matches(runtime, list(runtimes), n=1, cutoff=0.75):
            out.append(f"accelerator.runtime_version: {runtime} is not a TPU runtime; did you mean "
                       f"{tpu['runtime']}?")
    for i, zone in zones:
        said = _exists(live, "tpu", acc.accelerator_type, zone)
        if said is False or (said is None and not cat.tpu_offered(generation, zone)):
            where = sorted(tpu["zones"]) + [f"any zone of {r}" for r in tpu["regions"]
                                            if not any(region_of(z) == r for z in tpu["zones"])]
            out.append(f"zones[{i}]: {zone} has no TPU {generation}; {generation} is in {_listed(where, 8)}")
    return out
