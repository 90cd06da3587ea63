"""What a job's node costs an hour: its machine type (vCPUs and memory), its GPUs or TPU chips and its boot disk,
priced for its provisioning model in its region, from a price book (docs/gcp-facts.md §24).

A price book is the region's unit prices (a vCPU-hour of a machine series, a GiB-hour of its memory, a GPU-hour, a
TPU chip-hour, a GiB-month of disk), read from the Cloud Billing Catalog API's SKUs (`from_catalog`, the
documented shape of services.skus.list) or, when the catalog cannot be had, taken from the dated offline table
below (`offline`). Every priced figure carries its book's `note`, so a reader knows which one was used.

Pure: the standard library only. The controller's adapter (respawn.control.adapters.prices) fetches and caches
the catalog; the pure core (respawn.control.costs) prices node lives with what this module computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# Services of the Cloud Billing Catalog (gcp-facts §24): Compute Engine's SKUs hold the VMs, the GPUs, the disks and
# the newer TPUs (v5e, v5p, v6e); Cloud TPU's the older TPUs (v2-v4).
COMPUTE_SERVICE = "6F81-5844-456A"
TPU_SERVICE = "E000-3F24-B8AA"
# Disk prices are per GiB-month; Google's pricing pages turn them into hours with a 730-hour month (unverified).
HOURS_PER_MONTH = 730.0
# The boot disk Respawn prices: a balanced persistent disk (the create names no type; gcp-facts §24, unverified).
BOOT_DISK = "pd-balanced"

# A provisioning model → the price tier it is billed at. Spot and preemptible VMs are billed at the catalog's
# "Preemptible" usage type; flex-start VMs at a discount the catalog names apart (unverified), priced here at the
# on-demand rate: an upper bound, so a budget never runs out later than it should.
TIER = {"spot": "spot", "preemptible": "spot", "flex-start": "standard", "standard": "standard"}

# Machine series → how the catalog's SKU descriptions name its vCPUs and memory ("G2 Instance Core running in …").
SERIES = {"n1": "N1 Predefined Instance", "n2": "N2 Instance", "g2": "G2 Instance", "a2": "A2 Instance",
          "a3": "A3 Instance"}
# GPU accelerator type → how the catalog's SKU descriptions name it ("Nvidia L4 GPU running in Americas").
GPUS = {"nvidia-l4": "Nvidia L4", "nvidia-tesla-t4": "Nvidia Tesla T4", "nvidia-tesla-a100": "Nvidia Tesla A100",
        "nvidia-a100-80gb": "Nvidia Tesla A100 80GB", "nvidia-h100-80gb": "Nvidia H100 80GB"}
# TPU version (of accelerator_type VERSION-N) → how SKU descriptions name a chip, and TensorCores per N.
TPUS = {"v5litepod": ("TpuV5e", 1), "v5p": ("TpuV5p", 2), "v6e": ("TpuV6e", 1), "v4": ("Tpu-v4", 2)}
# Balanced persistent disk capacity, as SKU descriptions name it.
DISKS = {"pd-balanced": "Balanced PD Capacity"}

# Predefined machine types with their GPUs built in: vCPUs, memory (GiB), GPU type, GPU count (gcp-facts §24).
BUNDLED = {
    **{f"g2-standard-{n}": (n, 4 * n, "nvidia-l4", g)
       for n, g in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8))},
    **{f"a2-highgpu-{g}g": (12 * g, 85 * g, "nvidia-tesla-a100", g) for g in (1, 2, 4, 8)},
    "a2-megagpu-16g": (96, 1360, "nvidia-tesla-a100", 16),
    **{f"a2-ultragpu-{g}g": (12 * g, 170 * g, "nvidia-a100-80gb", g) for g in (1, 2, 4, 8)},
    "a3-highgpu-8g": (208, 1872, "nvidia-h100-80gb", 8),
}
# Series whose predefined types are SERIES-KIND-VCPUS, with their memory per vCPU (GiB).
MEMORY_PER_VCPU = {("n1", "standard"): 3.75, ("n1", "highmem"): 6.5, ("n1", "highcpu"): 0.9,
                   ("n2", "standard"): 4.0, ("n2", "highmem"): 8.0, ("n2", "highcpu"): 1.0}


@dataclass(frozen=True)
class Book:
    """One region's unit prices in USD: key → price per unit (an hour, a GiB-hour, a GiB-month for disks). Keys:
    cpu:SERIES:TIER, ram:SERIES:TIER, gpu:TYPE:TIER, tpu:VERSION:TIER (a chip-hour), disk:TYPE."""

    region: str
    source: str  # "catalog" or "offline"
    as_of: str  # the catalog's fetch date, or the offline table's
    rates: Mapping[str, float] = field(default_factory=dict)
    filled: tuple[str, ...] = ()  # keys of a catalog book taken from the offline table (with_offline)

    @property
    def note(self) -> str:
        """Which prices a figure was computed with, as every priced figure says."""
        what = "Cloud Billing Catalog" if self.source == "catalog" else "offline table"
        filled = f"; {', '.join(self.filled)} from the offline table of {OFFLINE_DATE}" if self.filled else ""
        return f"{what} of {self.as_of} ({self.region}{filled})"


@dataclass(frozen=True)
class Shape:
    """What a node is billed for: vCPUs and memory of a machine series, GPUs, TPU chips, a boot disk."""

    series: str | None = None
    vcpus: float = 0.0
    memory_gib: float = 0.0
    gpu: str | None = None
    gpus: int = 0
    tpu: str | None = None
    chips: float = 0.0
    disk_gb: float = 0.0


@dataclass(frozen=True)
class Rate:
    """A node's price an hour, at its own model and on demand; `note`: which book."""

    usd_per_hour: float
    on_demand_usd_per_hour: float
    note: str


@dataclass(frozen=True)
class Quote:
    """A job's node price an hour by provisioning model (None: not priced), and why one is missing."""

    rates: Mapping[str, Rate | None]
    why: str | None = None


def quote(accelerator: Any, book: Book) -> Quote:
    """The prices of a job's node (schema.GpuAccelerator or TpuAccelerator) for every model, from `book` (a unit a
    catalog book lacks from the offline table, named in each rate's note)."""
    shape = shape_of(accelerator)
    if shape is None:
        name = getattr(accelerator, "machine_type", None) or accelerator.accelerator_type
        return Quote({}, f"{name} is a type respawn/prices.py cannot price (its vCPUs, memory or chips are unknown)")
    books = {model: with_offline(book, missing(shape, model, book)) for model in TIER}
    rates = {model: rate(shape, model, books[model]) for model in TIER}
    lacking = sorted({key for model in TIER for key in missing(shape, model, books[model])})
    return Quote(rates, f"the {book.note} has no price for {', '.join(lacking)}" if lacking else None)


def usd(amount: float) -> str:
    """'$12.34'; under a dollar, four decimals ('$0.0032'), so a short job's cost does not read as $0.00."""
    return f"${amount:,.2f}" if abs(amount) >= 1 else f"${amount:.4f}"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def shape_of(accelerator: Any) -> Shape | None:
    """The shape of a job's node (a schema.GpuAccelerator or TpuAccelerator), or None for a machine type this module
    does not know (its price is then unknown, and said so)."""
    if accelerator.kind == "tpu":
        version, _, n = accelerator.accelerator_type.partition("-")
        if version not in TPUS or not n.isdigit():
            return None
        return Shape(tpu=version, chips=int(n) / TPUS[version][1])
    name, disk = accelerator.machine_type, float(accelerator.boot_disk_gb)
    if name in BUNDLED:
        vcpus, memory, gpu, count = BUNDLED[name]
        return Shape(name.split("-")[0], vcpus, memory, gpu, count, disk_gb=disk)
    parts = name.split("-")
    if len(parts) != 3 or not parts[2].isdigit() or (parts[0], parts[1]) not in MEMORY_PER_VCPU:
        return None
    vcpus = int(parts[2])
    gpu = accelerator.accelerator_type
    return Shape(parts[0], vcpus, vcpus * MEMORY_PER_VCPU[(parts[0], parts[1])], gpu,
                 accelerator.accelerator_count if gpu else 0, disk_gb=disk)


def _hourly(shape: Shape, tier: str, book: Book) -> tuple[float, list[str]]:
    parts: list[tuple[str, float]] = []
    if shape.series:
        parts += [(f"cpu:{shape.series}:{tier}", shape.vcpus), (f"ram:{shape.series}:{tier}", shape.memory_gib)]
    if shape.gpu and shape.gpus:
        parts.append((f"gpu:{shape.gpu}:{tier}", shape.gpus))
    if shape.tpu:
        parts.append((f"tpu:{shape.tpu}:{tier}", shape.chips))
    if shape.disk_gb:
        parts.append((f"disk:{BOOT_DISK}", shape.disk_gb / HOURS_PER_MONTH))
    missing = [key for key, _ in parts if key not in book.rates]
    return sum(book.rates.get(key, 0.0) * n for key, n in parts), missing


def rate(shape: Shape, model: str, book: Book) -> Rate | None:
    """A node's price an hour as `model` and on demand, or None when the book lacks a unit it needs."""
    own, missing = _hourly(shape, TIER[model], book)
    on_demand, missing_od = _hourly(shape, "standard", book)
    if missing or missing_od:
        return None
    return Rate(round(own, 6), round(on_demand, 6), book.note)


def missing(shape: Shape, model: str, book: Book) -> list[str]:
    """The price book keys a node of `shape` as `model` needs and `book` lacks (why rate() is None)."""
    return sorted(set(_hourly(shape, TIER[model], book)[1] + _hourly(shape, "standard", book)[1]))


# ---- the Cloud Billing Catalog's SKUs (services.skus.list; gcp-facts §24) -----------------------------------------

def unit_price(sku: Mapping[str, Any]) -> tuple[float, str] | None:
    """(USD per usage unit, the unit) of a SKU's first pricing info: the tier that starts at 0 (a Money is units +
    nanos / 1e9). None when the SKU has no such rate."""
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    expr = infos[0].get("pricingExpression") or {}
    tiers = [t for t in expr.get("tieredRates") or [] if float(t.get("startUsageAmount") or 0) == 0]
    if not tiers:
        return None
    money = tiers[0].get("unitPrice") or {}
    if money.get("currencyCode", "USD") != "USD":
        return None
    return int(money.get("units") or 0) + int(money.get("nanos") or 0) / 1e9, expr.get("usageUnit", "")


# Description words of SKUs that are not the plain price of a predefined resource.
_NOT_PLAIN = ("custom", "sole tenancy", "premium", "reserved", "commitment", "extended", "dws", "calendar")


def _key(sku: Mapping[str, Any]) -> str | None:
    """The price book key a SKU prices, or None for a SKU Respawn does not use."""
    desc = str(sku.get("description", ""))
    low = desc.lower()
    category = sku.get("category") or {}
    usage, group = category.get("usageType"), category.get("resourceGroup")
    if any(word in low for word in _NOT_PLAIN):
        return None
    for disk, name in DISKS.items():
        if low.startswith(name.lower()) and "regional" not in low:
            return f"disk:{disk}"
    for version, (name, _) in TPUS.items():
        # v4's SKUs price a pod's share, not a chip (gcp-facts §24): v4 is priced from the offline table alone.
        if version != "v4" and name.lower() in low:
            # Preemptible TPUs are OnDemand usage with "Preemptible" in the description (gcp-facts §24).
            return f"tpu:{version}:{'spot' if 'preemptible' in low else 'standard'}"
    tier = {"OnDemand": "standard", "Preemptible": "spot"}.get(str(usage))
    if tier is None:
        return None
    if group == "GPU":
        for gpu, name in GPUS.items():
            if f"{name} GPU".lower() in low:
                return f"gpu:{gpu}:{tier}"
        return None
    for series, name in SERIES.items():
        if f"{name} core".lower() in low or f"{name} ram".lower() in low:
            return f"{'cpu' if 'core' in low else 'ram'}:{series}:{tier}"
    return None


_HOURLY_UNITS = {"h": 1.0, "GiBy.h": 1.0}
_MONTHLY_UNITS = {"GiBy.mo": 1.0}


def from_catalog(skus: Iterable[Mapping[str, Any]], region: str, as_of: str) -> Book:
    """The price book of `region` from the catalog's SKUs (of Compute Engine and Cloud TPU): each SKU offered in
    the region (serviceRegions) that prices a unit Respawn uses, at its unit's price."""
    rates: dict[str, float] = {}
    for sku in skus:
        if region not in (sku.get("serviceRegions") or []):
            continue
        key = _key(sku)
        price = unit_price(sku) if key else None
        if key is None or price is None:
            continue
        usd, unit = price
        if key.startswith("disk:") and unit in _MONTHLY_UNITS or not key.startswith("disk:") and unit in _HOURLY_UNITS:
            rates.setdefault(key, usd)
    return Book(region, "catalog", as_of, rates)


# ---- the offline table ------------------------------------------------------------------------------------------
# What a job is priced with when the catalog cannot be had: list prices in USD for us-central1, as compiled on
# OFFLINE_DATE. Each figure: (price, where it is from, verified). "verified" means the figure was read on that page
# or in that dated table (gcp-facts §24 says what each is); the others are the list prices as last known to the
# author: treat them as estimates. Spot prices change as often as daily (https://cloud.google.com/spot-vms/pricing),
# so even a verified Spot figure is only its table's day's.
OFFLINE_DATE = "2026-11-26"
_VM = "https://cloud.google.com/compute/vm-instance-pricing"
_SPOT = "https://cloud.google.com/spot-vms/pricing"
_GPU = "https://cloud.google.com/compute/gpus-pricing"
_TPU = "https://cloud.google.com/tpu/pricing"
# A recorded catalog answer (tests/fixtures/billing_catalog_a2_recorded.json, effective 2023-03-24).
_RECORDED = ("https://github.com/opencost/opencost/blob/336428cf5017b383c1a8e63dd6af994e7f94cf58/"
             "pkg/cloud/gcp/test/skus.json")
# Machine-type prices generated from the catalog on 2026-07-30 (g2-standard-4/-8 on demand and Spot, n1-standard-8,
# the balanced disk); the G2 units reproduce its g2-standard-8 total exactly.
_TABLE_2026_07 = ("https://github.com/Cyclenerd/google-cloud-pricing-cost-calculator/blob/"
                  "fd66b26ff84fee5cdd94f341ea89206e76c06b99/pricing.yml")
# The Kubernetes cluster autoscaler's GCE price table (N1 units and their preemptible share, T4, disks).
_AUTOSCALER = ("https://github.com/kubernetes/autoscaler/blob/5a172bc2e4d35187476da8676156163e5d5652b0/"
               "cluster-autoscaler/cloudprovider/gce/gce_price_info.go")
# SkyPilot's GCP catalog (accelerator and TPU prices by region; undated, its L4 Spot figure is the 2025-2026 one).
_SKYPILOT = ("https://github.com/skypilot-org/skypilot-catalog/blob/017e2502fb63c7a28757acd94002b2d6099d3e3d/"
             "catalogs/v7/gcp/vms.csv")
OFFLINE_SOURCES: dict[str, dict[str, tuple[float, str, bool]]] = {
    "us-central1": {
        "cpu:n1:standard": (0.031611, _AUTOSCALER, True), "ram:n1:standard": (0.004237, _AUTOSCALER, True),
        "cpu:n1:spot": (0.006655, _AUTOSCALER, True), "ram:n1:spot": (0.000892, _AUTOSCALER, True),
        "cpu:g2:standard": (0.024988, _TABLE_2026_07, True), "ram:g2:standard": (0.002927, _TABLE_2026_07, True),
        # G2 Spot on 2026-07-30: vCPU + 4 GiB $0.020634 and the L4 $0.3148 (from the g2-standard-4 and -8 totals),
        # the vCPU / memory split as on demand (gcp-facts §24).
        "cpu:g2:spot": (0.014050, _TABLE_2026_07, True), "ram:g2:spot": (0.001646, _TABLE_2026_07, True),
        "cpu:a2:standard": (0.031611, _RECORDED, True), "ram:a2:standard": (0.004237, _RECORDED, True),
        "cpu:a2:spot": (0.01264, _SPOT, True), "ram:a2:spot": (0.001695, _SPOT, True),
        "cpu:a3:standard": (0.025400, _VM, False), "ram:a3:standard": (0.003400, _VM, False),
        "cpu:a3:spot": (0.0102, _SPOT, True), "ram:a3:spot": (0.000888, _SPOT, True),
        "gpu:nvidia-l4:standard": (0.560040, _TABLE_2026_07, True),
        "gpu:nvidia-l4:spot": (0.314800, _TABLE_2026_07, True),
        "gpu:nvidia-tesla-t4:standard": (0.350000, _AUTOSCALER, True),
        "gpu:nvidia-tesla-t4:spot": (0.140000, _SKYPILOT, True),
        "gpu:nvidia-tesla-a100:standard": (2.933908, _RECORDED, True),
        "gpu:nvidia-tesla-a100:spot": (1.173600, _SPOT, False),
        "gpu:nvidia-h100-80gb:standard": (9.575000, _GPU, False),
        "gpu:nvidia-h100-80gb:spot": (2.950000, _SPOT, False),
        "tpu:v5litepod:standard": (1.200000, _SKYPILOT, True), "tpu:v5litepod:spot": (0.212980, _SKYPILOT, True),
        "tpu:v4:standard": (3.220000, _TPU, False), "tpu:v4:spot": (0.966000, _TPU, False),
        "disk:pd-balanced": (0.100000, _TABLE_2026_07, True),
    },
}


def offline(region: str) -> Book | None:
    """The offline table's book for `region`, or None where the table has none."""
    figures = OFFLINE_SOURCES.get(region)
    if figures is None:
        return None
    return Book(region, "offline", OFFLINE_DATE, {k: v[0] for k, v in figures.items()})


def with_offline(book: Book, keys: Iterable[str]) -> Book:
    """A catalog book with those of `keys` it lacks taken from the offline table of its region, and named
    (`filled`, in the note): a catalog answer without a SKU Respawn reads (renamed, not offered in the region) then
    leaves one unit estimated rather than the whole node unpriced."""
    table = offline(book.region)
    if book.source != "catalog" or table is None:
        return book
    filled = tuple(sorted(k for k in set(keys) if k not in book.rates and k in table.rates))
    if not filled:
        return book
    return Book(book.region, book.source, book.as_of, {**book.rates, **{k: table.rates[k] for k in filled}},
                book.filled + filled)


def catalog_skus(book_rates: Mapping[str, float], region: str) -> list[dict[str, Any]]:
    """SKUs in the catalog's documented shape that price `book_rates` in `region` (what sim/ serves, and what a
    test's constructed catalog answer is made of): the inverse of from_catalog for the keys this module uses."""
    out = []
    for i, (key, usd) in enumerate(sorted(book_rates.items())):
        kind, _, rest = key.partition(":")
        name, _, tier = rest.partition(":")
        if kind == "tpu" and name == "v4":
            continue
        usage = "Preemptible" if tier == "spot" else "OnDemand"
        spot = "Spot Preemptible " if tier == "spot" else ""
        if kind in ("cpu", "ram"):
            desc = f"{spot}{SERIES[name]} {'Core' if kind == 'cpu' else 'Ram'} running in Americas"
            group, unit, family = ("CPU" if kind == "cpu" else "RAM"), ("h" if kind == "cpu" else "GiBy.h"), "Compute"
        elif kind == "gpu":
            desc, group, unit, family = f"{spot}{GPUS[name]} GPU running in Americas", "GPU", "h", "Compute"
        elif kind == "tpu":
            pre = "Preemptible " if tier == "spot" else ""
            desc, group, unit, family, usage = f"{TPUS[name][0]} chip {pre}hour in Iowa", "TPU", "h", "Compute", "OnDemand"
        else:
            desc, group, unit, family, usage = f"{DISKS[name]} in Iowa", "SSD", "GiBy.mo", "Storage", "OnDemand"
        units, nanos = int(usd), round((usd - int(usd)) * 1e9)
        out.append({
            "name": f"services/{COMPUTE_SERVICE}/skus/SIM-{i:04d}", "skuId": f"SIM-{i:04d}", "description": desc,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": family, "resourceGroup": group,
                         "usageType": usage},
            "serviceRegions": [region],
            "pricingInfo": [{"summary": "", "pricingExpression": {
                "usageUnit": unit, "usageUnitDescription": unit, "baseUnit": unit, "baseUnitConversionFactor": 1,
                "displayQuantity": 1,
                "tieredRates": [{"startUsageAmount": 0,
                                 "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos}}]},
                "currencyConversionRate": 1, "effectiveTime": "2026-11-26T00:00:00Z"}],
            "serviceProviderName": "Google",
        })
    return out
