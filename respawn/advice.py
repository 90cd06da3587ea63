"""Capacity advice and regional quotas (docs/gcp-facts.md §20, §21), pure: the REST bodies of `advice.capacity`,
`advice.capacityHistory` and `regions.get` as the installed compute_v1 types spell them (camelCase JSON), what their
answers mean, the quota metric of an accelerator, and the quota verdict `respawn jobs register` gives. Standard
library only: the controller's adapter (respawn.control.adapters.advice) builds the real compute_v1 types from these
bodies, the CLI (respawn.app.quotacheck, `respawn zones`) posts them through respawn.app.compute_read, and the
sim answers them (sim/advice.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

# How long one zone × machine shape's advice is reused by every job before it is asked again: the scores move over
# hours (gcp-facts §20: daily history, best-effort uptime), and each job's placement asks per zone.
CACHE_SECONDS = 300
# The one provisioning model advice scores (gcp-facts §20: advice.capacity is for Spot VMs; capacityHistory must be
# SPOT). Only a job's Spot tier is ranked by it.
ADVICE_MODEL = "SPOT"
# What Respawn's provisioning models are charged to: Spot, preemptible and flex-start VMs to the PREEMPTIBLE_ quota
# metrics, on-demand to the plain ones (gcp-facts §18, §21).
PREEMPTIBLE_MODELS = ("spot", "preemptible", "flex-start")

# GPU → its regional quota metric (on-demand; PREEMPTIBLE_ + it for Spot, preemptible and flex-start), gcp-facts §21.
GPU_METRICS = {
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}
# Machine series whose GPUs are built in (no guestAccelerators): the GPU they carry (gcp-facts §21's table).
BUILTIN_GPUS = (
    ("g2-", "nvidia-l4"), ("a2-highgpu-", "nvidia-tesla-a100"), ("a2-megagpu-", "nvidia-tesla-a100"),
    ("a2-ultragpu-", "nvidia-a100-80gb"), ("a3-highgpu-", "nvidia-h100-80gb"), ("a3-edgegpu-", "nvidia-h100-80gb"),
    ("a3-megagpu-", "nvidia-h100-mega-80gb"), ("a3-ultragpu-", "nvidia-h200-141gb"), ("a4-highgpu-", "nvidia-b200"),
)
# G2's GPUs per machine type (its names end in vCPUs, not GPUs); other built-in series end in -<N>g.
G2_GPUS = {"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-24": 2,
           "g2-standard-32": 1, "g2-standard-48": 4, "g2-standard-96": 8}
_GPUS_SUFFIX = re.compile(r"-(\d+)g$")


@dataclass(frozen=True)
class Shape:
    """What one VM of a job is, as advice and quotas see it."""

    machine_type: str
    accelerator_type: str | None = None  # attached GPUs (guestAccelerators); None: built in, or none
    accelerator_count: int = 1

    @property
    def gpu(self) -> str | None:
        """The GPU the VM carries (attached or built in), or None."""
        if self.accelerator_type:
            return self.accelerator_type
        return next((gpu for prefix, gpu in BUILTIN_GPUS if self.machine_type.startswith(prefix)), None)

    @property
    def gpus(self) -> int | None:
        """GPUs per VM; None when a built-in series' count is not known here."""
        if self.accelerator_type:
            return self.accelerator_count
        if self.machine_type in G2_GPUS:
            return G2_GPUS[self.machine_type]
        m = _GPUS_SUFFIX.search(self.machine_type)
        return int(m[1]) if m and self.gpu else None

    @property
    def capacity_key(self) -> str:
        """The key of Respawn's capacity records (cooldowns, statistics): the attached GPU, else the machine type
        (respawn.control.placement.accelerator_key of a GPU job)."""
        return self.accelerator_type or self.machine_type

    def key(self, size: int = 1) -> str:
        """The cache key of this shape's advice (a Firestore document id part: no '/')."""
        attached = f"+{self.accelerator_count}x{self.accelerator_type}" if self.accelerator_type else ""
        base = self.machine_type + attached
        return base + (f"*{size}" if size > 1 else "")


def shape_of(accelerator: Any) -> Shape | None:
    """A GPU job's Shape from its spec's accelerator (respawn.schema.GpuAccelerator); None for a TPU (advice
    cannot score TPUs, gcp-facts §20, and their quotas are not in regions.get, §21)."""
    if getattr(accelerator, "kind", None) != "gpu":
        return None
    return Shape(accelerator.machine_type, accelerator.accelerator_type, accelerator.accelerator_count)


def gpu_of(accelerator: str) -> str | None:
    """The GPU of a capacity key (respawn.control.placement.accelerator_key: a GPU type, or the machine type of a
    series with built-in GPUs), or None (a machine type without GPUs, a TPU type)."""
    return accelerator if accelerator in GPU_METRICS else Shape(accelerator).gpu


def quota_metric(gpu: str | None, model: str) -> str | None:
    """The regions.get metric a VM of `gpu` under Respawn's provisioning `model` is charged to; None for a GPU this
    table does not know (then nothing is checked)."""
    metric = GPU_METRICS.get(gpu or "")
    if metric is None:
        return None
    return ("PREEMPTIBLE_" if model in PREEMPTIBLE_MODELS else "") + metric


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def zone_name(url_or_name: str) -> str:
    """The zone of a shard's or a location's zone field (a name or a URL)."""
    return url_or_name.rstrip("/").rsplit("/", 1)[-1]


# --- advice.capacity ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZoneAdvice:
    """advice.capacity's scores for one zone: obtainability 0-1 (higher is better) and the estimated uptime of a Spot
    VM before its preemption, in seconds (None: not given or not readable)."""

    obtainability: float
    uptime_seconds: float | None = None


def capacity_request(shape: Shape, zone: str, size: int = 1) -> dict[str, Any]:
    """A CapacityAdviceRequest (REST JSON) for `size` Spot VMs of `shape` in `zone` alone: one recommendation covers
    shards in several zones, so a per-zone score needs one request per zone (gcp-facts §20)."""
    selection: dict[str, Any] = {"machineTypes": [shape.machine_type]}
    if shape.accelerator_type:
        selection["guestAccelerators"] = [{"acceleratorType": shape.accelerator_type,
                                           "acceleratorCount": shape.accelerator_count}]
    return {
        "size": size,
        "instanceProperties": {"scheduling": {"provisioningModel": ADVICE_MODEL}},
        "instanceFlexibilityPolicy": {"instanceSelections": {"respawn": selection}},
        "distributionPolicy": {"zones": [{"zone": f"zones/{zone}"}], "targetShape": "ANY_SINGLE_ZONE"},
    }


def parse_duration(text: Any) -> float | None:
    """A protobuf JSON duration ("600s", "3600.5s") in seconds; None when it is not one."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)s\s*", str(text or ""))
    return float(m[1]) if m else None


def parse_capacity(body: Mapping[str, Any], zone: str) -> ZoneAdvice | None:
    """The scores of the recommendation for `zone` in a CapacityAdviceResponse (REST JSON), or None if none names it
    (a recommendation without shards is taken as the zone asked for)."""
    for rec in body.get("recommendations") or []:
        shards = rec.get("shards") or []
        if shards and not any(zone_name(s.get("zone", "")) == zone for s in shards):
            continue
        scores = rec.get("scores") or {}
        return ZoneAdvice(float(scores.get("obtainability") or 0.0), parse_duration(scores.get("estimatedUptime")))
    return None


# --- advice.capacityHistory -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """capacityHistory for one zone: daily Spot preemption rates and list prices, oldest first."""

    preemption_rates: tuple[float, ...] = ()
    prices: tuple[tuple[float, str], ...] = ()  # (amount, currency)

    def recent_rate(self, days: int = 7) -> float | None:
        """The mean preemption rate of the last `days` days that have one."""
        recent = self.preemption_rates[-days:]
        return sum(recent) / len(recent) if recent else None

    @property
    def price(self) -> tuple[float, str] | None:
        return self.prices[-1] if self.prices else None


def history_request(shape: Shape, zone: str) -> dict[str, Any]:
    """A CapacityHistoryRequest (REST JSON) for Spot VMs of `shape` in `zone`: both the preemption and price history."""
    props: dict[str, Any] = {"machineType": shape.machine_type, "scheduling": {"provisioningModel": ADVICE_MODEL}}
    if shape.accelerator_type:
        props["guestAccelerators"] = [{"acceleratorType": shape.accelerator_type,
                                       "acceleratorCount": shape.accelerator_count}]
    return {"instanceProperties": props, "locationPolicy": {"location": f"zones/{zone}"},
            "types": ["PREEMPTION", "PRICE"]}


def _money(m: Mapping[str, Any]) -> tuple[float, str]:
    return int(m.get("units") or 0) + int(m.get("nanos") or 0) / 1e9, str(m.get("currencyCode") or "")


def _by_start(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(records, key=lambda r: str((r.get("interval") or {}).get("startTime") or ""))


def parse_history(body: Mapping[str, Any]) -> History:
    """A CapacityHistoryResponse (REST JSON)."""
    return History(tuple(float(r.get("preemptionRate") or 0.0) for r in _by_start(body.get("preemptionHistory") or [])),
                   tuple(_money(r.get("listPrice") or {}) for r in _by_start(body.get("priceHistory") or [])))


# --- regions.get: quotas ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quota:
    limit: float
    usage: float


def parse_quotas(region: Mapping[str, Any]) -> dict[str, Quota] | None:
    """metric → Quota of a Region (REST JSON); None when Compute says it could not fetch them
    (quotaStatusWarning: the quotas are unknown, not 0, gcp-facts §21)."""
    if region.get("quotaStatusWarning"):
        return None
    return {str(q.get("metric")): Quota(float(q.get("limit") or 0.0), float(q.get("usage") or 0.0))
            for q in region.get("quotas") or [] if q.get("metric")}


def quota_command(metric: str, region: str, project: str | None) -> str:
    """How to ask for more of a regional quota: Cloud Quotas' preference for the metric's quota id, which the
    second command finds (the id is not derived here: unverified, docs/gcp-facts.md §21)."""
    p = project or "PROJECT"
    return (f"gcloud beta quotas preferences create --service=compute.googleapis.com --project={p} "
            f"--quota-id=QUOTA_ID --dimensions=region={region} --preferred-value=N, QUOTA_ID being the quotaId of "
            f"`gcloud beta quotas info list --service=compute.googleapis.com --project={p} "
            f"--filter=metric=compute.googleapis.com/{metric.lower()}`")


@dataclass
class QuotaVerdict:
    """What `respawn jobs register` says of a job's quotas: `refuse` (with `lines` saying why and how to ask for
    more) when no listed zone's region can ever serve any tier the job may use; otherwise warnings, maybe none."""

    refuse: bool = False
    lines: list[str] = field(default_factory=list)


def quota_verdict(zones: Sequence[str], models: Sequence[str], shape: Shape, nodes: int,
                  quotas: Mapping[str, Mapping[str, Quota] | None], project: str | None) -> QuotaVerdict:
    """The job's quota verdict from each region's quotas (region → metric → Quota; a region or metric missing: not
    known). A tier cannot run in a region whose limit for its metric is 0. A PREEMPTIBLE_ limit of 0 alone is a
    warning: such VMs may be charged to the on-demand quota instead (unverified, gcp-facts §21), so that tier is
    ruled out only when the on-demand limit is 0 as well. Refused only when every listed zone's region rules out
    every tier the job may use, all of it known; a GPU the table does not know says nothing."""
    gpu = shape.gpu
    if any(quota_metric(gpu, m) is None for m in models):
        return QuotaVerdict()
    verdict, asks = QuotaVerdict(), []
    need = (shape.gpus or 0) * nodes
    regions = list(dict.fromkeys(region_of(z) for z in zones))
    ruled_out = 0  # (region, tier) pairs that certainly cannot run
    for region in regions:
        known = quotas.get(region) or {}
        for model in dict.fromkeys(models):
            metric = quota_metric(gpu, model) or ""
            q = known.get(metric)
            if q is None:
                continue
            if q.limit > 0:
                if need and q.limit - q.usage < need:
                    verdict.lines.append(f"{region}: {metric} has {q.limit - q.usage:g} of {q.limit:g} free; the job "
                                         f"needs {need} ({nodes} × {shape.gpus} {gpu})")
                continue
            asks.append(quota_command(metric, region, project))
            plain = known.get(metric.removeprefix("PREEMPTIBLE_"))
            if metric.startswith("PREEMPTIBLE_") and (plain is None or plain.limit > 0):
                verdict.lines.append(f"{region}: {metric} limit is 0; {model} VMs may still be charged to "
                                     f"{metric.removeprefix('PREEMPTIBLE_')} (unverified, docs/gcp-facts.md §21)")
                continue
            ruled_out += 1
            verdict.lines.append(f"{region}: {metric} limit is 0: no {model} VM can start there")
    if asks:
        verdict.lines.append("to ask for quota: " + " ; ".join(dict.fromkeys(asks)))
    verdict.refuse = ruled_out == len(regions) * len(dict.fromkeys(models))
    return verdict
