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

from .catalog import load

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
    borrowed: tuple[str, ...] = ()  # keys the offline table has for `like`, not this region (offline())
    like: str | None = None  # the nearest region the offline table lists, whose prices fill this one's in

    @property
    def note(self) -> str:
        """Which prices the book's figures are, as every priced figure says (`note_for`: of the units one used)."""
        return self.note_for(self.rates)

    def note_for(self, keys: Iterable[str]) -> str:
        """Which prices a figure computed with `keys` was computed with: the book's, and those of its units taken
        from the offline table or, where the table lists no price for the region, from its nearest listed region."""
        keys = set(keys)
        what = "Cloud Billing Catalog" if self.source == "catalog" else "offline table"
        borrowed = sorted(keys & set(self.borrowed))
        filled = sorted(keys & set(self.filled) - set(borrowed))
        parts = [f"{', '.join(filled)} from the offline table of {OFFLINE_DATE}"] if filled else []
        nearest = f"{self.like}'s, the nearest region the table lists"
        if borrowed and self.source == "offline" and not keys - set(borrowed):
            return f"{what} of {self.as_of} ({self.region} priced as {nearest})"
        if borrowed:
            table = "" if self.source == "offline" else f" from the offline table of {OFFLINE_DATE}"
            units = ", ".join(borrowed) if len(borrowed) <= 4 else "the other units"
            parts.append(f"{units}{table} as {nearest}")
        return f"{what} of {self.as_of} ({'; '.join([self.region, *parts])})"


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
    where = ("the offline table of {d} has none" if book.source == "offline" else
             f"neither the Cloud Billing Catalog of {book.as_of} nor the offline table of {{d}} has one")
    return Quote(rates, f"no price for {', '.join(lacking)} in {book.region}: {where.format(d=OFFLINE_DATE)}"
                 if lacking else None)


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


def _keys(shape: Shape, tier: str) -> list[str]:
    return [key for key, _ in _parts(shape, tier)]


def _hourly(shape: Shape, tier: str, book: Book) -> tuple[float, list[str]]:
    parts = _parts(shape, tier)
    missing = [key for key, _ in parts if key not in book.rates]
    return sum(book.rates.get(key, 0.0) * n for key, n in parts), missing


def _parts(shape: Shape, tier: str) -> list[tuple[str, float]]:
    """The units a node of `shape` is billed for at `tier`, and how many of each."""
    parts: list[tuple[str, float]] = []
    if shape.series:
        parts += [(f"cpu:{shape.series}:{tier}", shape.vcpus), (f"ram:{shape.series}:{tier}", shape.memory_gib)]
    if shape.gpu and shape.gpus:
        parts.append((f"gpu:{shape.gpu}:{tier}", shape.gpus))
    if shape.tpu:
        parts.append((f"tpu:{shape.tpu}:{tier}", shape.chips))
    if shape.disk_gb:
        parts.append((f"disk:{BOOT_DISK}", shape.disk_gb / HOURS_PER_MONTH))
    return parts


def rate(shape: Shape, model: str, book: Book) -> Rate | None:
    """A node's price an hour as `model` and on demand, or None when the book lacks a unit it needs."""
    own, missing = _hourly(shape, TIER[model], book)
    on_demand, missing_od = _hourly(shape, "standard", book)
    if missing or missing_od:
        return None
    return Rate(round(own, 6), round(on_demand, 6), book.note_for(_keys(shape, TIER[model]) + _keys(shape, "standard")))


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
# What a job is priced with when the catalog cannot be had: list prices in USD, as compiled on OFFLINE_DATE: every
# unit for us-central1 (a full region, FULL_REGIONS), and the units known for other regions (the TPUs'). A region of
# the catalog's zones (respawn/catalog.py) takes the units it lacks from its nearest full region, and every figure
# priced so says which (Book.note_for). Each figure: (price, where it is from, verified). "verified" means the figure was read on that page
# or in that dated table (gcp-facts §24 says what each is); the others are the list prices as last known to the
# author: treat them as estimates. Spot prices change as often as daily (https://cloud.google.com/spot-vms/pricing),
# so even a verified Spot figure is only its table's day's.
OFFLINE_DATE = "2026-11-28"
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


def _skypilot_tpus(v6e: tuple[float, float] | None = None,
                   v5p: tuple[float, float] | None = None) -> dict[str, tuple[float, str, bool]]:
    """A region's TPU chip-hours from SkyPilot's rows: v6e from tpu-v6e-1 (one chip; on demand, Spot), v5p from
    tpu-v5p-12160 (6080 chips: 12160 TensorCores, two a chip)."""
    out: dict[str, tuple[float, str, bool]] = {}
    for version, row, chips in (("v6e", v6e, 1), ("v5p", v5p, 6080)):
        if row is not None:
            out[f"tpu:{version}:standard"] = (round(row[0] / chips, 6), _SKYPILOT, True)
            out[f"tpu:{version}:spot"] = (round(row[1] / chips, 6), _SKYPILOT, True)
    return out


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
        **_skypilot_tpus(v6e=(2.7, 0.64833), v5p=(25536.0, 10214.4)),
        "disk:pd-balanced": (0.100000, _TABLE_2026_07, True),
    },
    # Other regions' TPU chip-hours, from the same SkyPilot catalog's rows (tpu-v6e-1, tpu-v5p-12160).
    **{region: _skypilot_tpus(**tpus) for region, tpus in {
        "us-east1": dict(v6e=(2.7, 0.64833), v5p=(25536.0, 10214.4)),
        "us-east4": dict(v6e=(2.7, 0.85833)),
        "us-east5": dict(v6e=(2.7, 1.08), v5p=(25536.0, 9485.3472)),
        "us-south1": dict(v6e=(2.7, 1.89), v5p=(29056.32, 14564.032)),
        "us-west1": dict(v6e=(2.7, 0.64833)),
        "europe-west1": dict(v5p=(27113.4864, 10845.39456)),
        "europe-west4": dict(v6e=(2.97, 0.71316), v5p=(25855.2, 8198.8192)),
        "asia-northeast1": dict(v6e=(3.24, 1.07681)),
        "asia-south1": dict(v6e=(3.24, 2.27)),
        "asia-southeast1": dict(v6e=(2.97, 0.72958)),
    }.items()},
}
# The regions the offline table prices every unit of; any other takes the units it lacks from the nearest of these.
FULL_REGIONS = ("us-central1",)


def nearest_full(region: str) -> str:
    """The full region of the offline table nearest `region`: one of its own geography (us, europe, asia, ...) if
    the table has one, else the first."""
    return next((r for r in FULL_REGIONS if r.split("-")[0] == region.split("-")[0]), FULL_REGIONS[0])


def offline(region: str) -> Book | None:
    """The offline table's book for `region` (a region of the catalog's zones, or one the table lists): its own
    figures, the units it lacks from its nearest full region (`borrowed`, `like`); None for a region neither knows."""
    own = {k: v[0] for k, v in OFFLINE_SOURCES.get(region, {}).items()}
    if not own and region not in load().data["regions"] and region not in {
            z.rsplit("-", 1)[0] for z in load().data.get("tpu_only_zones", {})}:
        return None
    if region in FULL_REGIONS:
        return Book(region, "offline", OFFLINE_DATE, own)
    like = nearest_full(region)
    base = {k: v[0] for k, v in OFFLINE_SOURCES[like].items()}
    return Book(region, "offline", OFFLINE_DATE, {**base, **own}, borrowed=tuple(sorted(set(base) - set(own))),
                like=like)


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
                book.filled + filled, book.borrowed + tuple(k for k in filled if k in table.borrowed), table.like)


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
