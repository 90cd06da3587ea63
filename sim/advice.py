"""Capacity advice and regions.get (docs/gcp-facts.md §20, §21) answered from the sim's capacity model.

advice.capacity (`POST /compute/v1/projects/P/regions/R/advice/capacity`, a CapacityAdviceRequest) scores each zone
of the request's distributionPolicy (default: every zone the sim's capacity and quota timelines name in R): one
recommendation per zone, best first, with `scores {obtainability, estimatedUptime}` and one shard. A test sets a zone ×
machine type's scores with `set()`; otherwise they follow the capacity timeline of the request's accelerator (its
guestAccelerators' type, else the machine type, as sim/compute.py keys capacity) for Spot at the moment asked:
unlimited → DEFAULT_OBTAINABILITY; room for `size` more VMs → LIMITED_OBTAINABILITY; no room → 0.0. The estimated
uptime is the time until the timeline's next step that lowers Spot capacity below what is in use, rounded down to
the values gcloud shows (60 s, 600 s, 3600 s); DEFAULT_UPTIME without one.

advice.capacityHistory (`…/advice/capacityHistory`, a CapacityHistoryRequest) answers one CapacityHistoryResponse for
the request's machine type and location (a zone; a region answers its first zone that was set, else defaults):
HISTORY_DAYS daily records ending at the last midnight Pacific time, oldest first. Rates and prices set with `set()`
(the newest last) fill the newest days; the other days get the default rate (0.0 where the zone's Spot capacity was
never limited, LIMITED_RATE where it was) and DEFAULT_PRICE_USD.

regions.get (`GET /compute/v1/projects/P/regions/R`) lists, in `quotas[]`, the metric of every quota step in force
in R (respawn.advice.quota_metric of the accelerator: PREEMPTIBLE_ for the "SPOT" pool, the plain one for
"STANDARD"; a step for every model sets both) with its limit and the nodes holding it now. The sim counts quota in
nodes, so these figures are nodes, which is GPUs for one GPU per node. Unlimited quotas are not listed (a metric
Compute does not list is unknown to Respawn: nothing is checked).

Only Spot is scored (provisioningModel other than SPOT: 400). Faults: `set_api_faults(methods=("advice",))`
answers both advice calls, `("region",)` regions.get.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from respawn.advice import ADVICE_MODEL, gpu_of, quota_metric, zone_name
from sim.capacity import region_of
from sim.compute_instance import BASE
from sim.core import compute_error
from sim.runtime import SimRuntime

DEFAULT_OBTAINABILITY = 0.9
LIMITED_OBTAINABILITY = 0.6
DEFAULT_UPTIME = 3600.0
UPTIME_STEPS = (60.0, 600.0, 3600.0)  # the values gcloud shows for estimatedUptime (gcp-facts §20)
HISTORY_DAYS = 30
LIMITED_RATE = 0.25
DEFAULT_PRICE_USD = 0.5
try:
    from zoneinfo import ZoneInfo

    PACIFIC: Any = ZoneInfo("America/Los_Angeles")  # history days end at midnight Pacific time (gcp-facts §20)
except Exception:  # noqa: BLE001 - no tz database: standard time all year
    PACIFIC = timezone(timedelta(hours=-8))


@dataclass
class Setting:
    obtainability: float | None = None
    estimated_uptime: float | None = None  # seconds
    preemption_rates: tuple[float, ...] = ()
    prices: tuple[float, ...] = ()  # USD


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _money(usd: float) -> dict[str, Any]:
    units = int(usd)
    return {"currencyCode": "USD", "units": str(units), "nanos": int(round((usd - units) * 1e9))}


def _spot(model: str) -> None:
    if model != ADVICE_MODEL:
        raise compute_error(400, "invalid", f"Invalid value for field 'provisioningModel': '{model}'. "
                                            f"Capacity advice is available for {ADVICE_MODEL} VMs only.")


class AdviceService:
    def __init__(self, rt: SimRuntime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._set: dict[tuple[str, str], Setting] = {}

    def set(self, zone: str, machine_type: str, *, obtainability: float | None = None,
            estimated_uptime: float | None = None, preemption_rates: list[float] | None = None,
            prices: list[float] | None = None) -> None:
        """Advice for `machine_type` in `zone`: scores (obtainability 0-1, uptime in seconds) and the newest days'
        preemption rates and Spot prices (USD), oldest first; what is not given keeps its default."""
        if obtainability is not None and not 0.0 <= obtainability <= 1.0:
            raise ValueError(f"obtainability must be within 0-1, not {obtainability}")
        with self._lock:
            s = self._set.setdefault((zone, machine_type), Setting())
            if obtainability is not None:
                s.obtainability = float(obtainability)
            if estimated_uptime is not None:
                s.estimated_uptime = float(estimated_uptime)
            if preemption_rates is not None:
                s.preemption_rates = tuple(float(r) for r in preemption_rates)[-HISTORY_DAYS:]
            if prices is not None:
                s.prices = tuple(float(p) for p in prices)[-HISTORY_DAYS:]

    def _setting(self, zone: str, machine_type: str) -> Setting:
        with self._lock:
            return self._set.get((zone, machine_type), Setting())

    # --- advice.capacity ---------------------------------------------------------------------------------------

    def capacity(self, region: str, body: dict) -> dict:
        _spot(((body.get("instanceProperties") or {}).get("scheduling") or {}).get("provisioningModel", ""))
        selections = ((body.get("instanceFlexibilityPolicy") or {}).get("instanceSelections") or {}).values()
        selection = next(iter(selections), None)
        if not selection or not selection.get("machineTypes"):
            raise compute_error(400, "invalid", "Invalid value for field 'instanceFlexibilityPolicy': at least one "
                                                "instance selection with machineTypes is required.")
        machine_type = selection["machineTypes"][0]
        accels = selection.get("guestAccelerators") or []
        accelerator = zone_name(accels[0]["acceleratorType"]) if accels else machine_type
        size = int(body.get("size") or 1)
        zones = [zone_name(z.get("zone", "")) for z in (body.get("distributionPolicy") or {}).get("zones") or []]
        for zone in zones:
            if region_of(zone) != region:
                raise compute_error(400, "invalid", f"Zone '{zone}' is not in region '{region}'.")
        recs = []
        for zone in zones or self._zones(region):
            obtainability, uptime = self.scores(zone, machine_type, accelerator, size)
            recs.append({"scores": {"obtainability": obtainability, "estimatedUptime": f"{uptime:g}s"},
                         "shards": [{"zone": f"{BASE}/projects/{self.rt.project}/zones/{zone}",
                                     "machineType": machine_type, "provisioningModel": ADVICE_MODEL,
                                     "instanceCount": size}]})
        recs.sort(key=lambda r: -r["scores"]["obtainability"])
        return {"recommendations": recs}

    def scores(self, zone: str, machine_type: str, accelerator: str, size: int = 1) -> tuple[float, float]:
        """(obtainability, estimated uptime in seconds): what was set, else what the capacity timeline says now."""
        s = self._setting(zone, machine_type)
        t = self.rt.now()
        limit, specific = self.rt.capacity.limit(zone, accelerator, "SPOT", t)
        used = self.rt.usage("capacity", zone, accelerator, "SPOT" if specific else None)
        if s.obtainability is not None:
            obtainability = s.obtainability
        elif limit is None:
            obtainability = DEFAULT_OBTAINABILITY
        else:
            obtainability = LIMITED_OBTAINABILITY if limit - used >= size else 0.0
        uptime = s.estimated_uptime
        if uptime is None:
            uptime = DEFAULT_UPTIME
            for at, later in self._spot_steps(zone, accelerator):
                if at > t and later is not None and later < max(used, 1):
                    uptime = max([u for u in UPTIME_STEPS if u <= at - t] or [UPTIME_STEPS[0]])
                    break
        return obtainability, uptime

    def _spot_steps(self, zone: str, accelerator: str) -> list[tuple[float, int | None]]:
        """The capacity steps that bind Spot VMs of `accelerator` in `zone` (its SPOT steps, else those for all)."""
        steps = [s for s in self.rt.capacity.snapshot() if s["scope"] == zone and s["acceleratorType"] == accelerator]
        spot = ([s for s in steps if s["provisioningModel"] == "SPOT"]
                or [s for s in steps if s["provisioningModel"] is None])
        return [(s["at"], s["limit"]) for s in spot]

    def _zones(self, region: str) -> list[str]:
        scopes = {s["scope"] for s in self.rt.capacity.snapshot()} | {z for z, _ in self._set}
        return sorted(z for z in scopes if region_of(z) == region) or [f"{region}-a", f"{region}-b", f"{region}-c"]

    # --- advice.capacityHistory --------------------------------------------------------------------------------

    def history(self, region: str, body: dict) -> dict:
        props = body.get("instanceProperties") or {}
        _spot((props.get("scheduling") or {}).get("provisioningModel", ""))
        machine_type = zone_name(props.get("machineType") or "")
        if not machine_type:
            raise compute_error(400, "invalid", "Required field 'instanceProperties.machineType' not specified.")
        accels = props.get("guestAccelerators") or []
        accelerator = zone_name(accels[0]["acceleratorType"]) if accels else machine_type
        location = zone_name((body.get("locationPolicy") or {}).get("location") or region)
        zone = location if location != region else self._zones(region)[0]
        if region_of(zone) != region:
            raise compute_error(400, "invalid", f"Location '{location}' is not in region '{region}'.")
        s = self._setting(zone, machine_type)
        limited = any(limit is not None for _, limit in self._spot_steps(zone, accelerator))
        rates = [LIMITED_RATE if limited else 0.0] * HISTORY_DAYS
        prices = [DEFAULT_PRICE_USD] * HISTORY_DAYS
        rates[HISTORY_DAYS - len(s.preemption_rates):] = s.preemption_rates
        prices[HISTORY_DAYS - len(s.prices):] = s.prices
        end = datetime.now(PACIFIC).replace(hour=0, minute=0, second=0, microsecond=0)
        days = [(end - timedelta(days=HISTORY_DAYS - i), end - timedelta(days=HISTORY_DAYS - i - 1))
                for i in range(HISTORY_DAYS)]
        types = body.get("types") or ["PREEMPTION", "PRICE"]
        out: dict[str, Any] = {"location": f"{BASE}/projects/{self.rt.project}/zones/{zone}",
                               "machineType": machine_type}
        if "PREEMPTION" in types:
            out["preemptionHistory"] = [{"interval": {"startTime": _rfc3339(a), "endTime": _rfc3339(b)},
                                         "preemptionRate": r} for (a, b), r in zip(days, rates)]
        if "PRICE" in types:
            out["priceHistory"] = [{"interval": {"startTime": _rfc3339(a), "endTime": _rfc3339(b)},
                                    "listPrice": _money(p)} for (a, b), p in zip(days, prices)]
        return out

    # --- regions.get -------------------------------------------------------------------------------------------

    def region(self, region: str) -> dict:
        t = self.rt.now()
        quotas = []
        for accelerator in sorted({s["acceleratorType"] for s in self.rt.quota.snapshot() if s["scope"] == region}):
            for model, pool in (("spot", "SPOT"), ("standard", "STANDARD")):
                metric = quota_metric(gpu_of(accelerator), model)
                limit, specific = self.rt.quota.limit(region, accelerator, pool, t)
                if metric is None or limit is None:
                    continue
                used = self.rt.usage("quota", region, accelerator, pool if specific else None)
                quotas.append({"metric": metric, "limit": float(limit), "usage": float(used)})
        return {"kind": "compute#region", "id": str(zlib.crc32(region.encode())), "name": region, "status": "UP",
                "description": region, "selfLink": f"{BASE}/projects/{self.rt.project}/regions/{region}",
                "zones": [f"{BASE}/projects/{self.rt.project}/zones/{z}" for z in self._zones(region)],
                "quotas": quotas}
