"""Prices from the Cloud Billing Catalog API, cached for every job (gcp-facts §24).

CatalogApi is services.skus.list over HTTP (`GET {endpoint}/v1/services/{service}/skus`, paged by nextPageToken;
an API key as `key=` when one is set, else the session's credentials). CatalogPrices is the port's adapter
(ports.PriceSource): one region's price book (respawn.prices.Book) from the Firestore document prices/{region},
fetched again from the catalog once it is a day old. When the catalog cannot be read (no API key where one is
needed, the API not enabled, a region without SKUs) the book is the cached one, else the dated offline table
(respawn.prices.offline), and that is retried after an hour: a failure is logged once per try with what to do.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from respawn import logs, prices

from .jsonapi import checked

PRODUCTION = "https://cloudbilling.googleapis.com"
TIMEOUT_S = 30
PAGE_SIZE = 5000  # the most the catalog returns per page (gcp-facts §24)
PRICES = "prices"  # prices/{region}: the price book cached for every job
REFRESH = timedelta(days=1)  # Spot prices change at most once a day (gcp-facts §24)
RETRY = timedelta(hours=1)  # after a failed fetch, the fallback is used this long before the catalog is asked again


class CatalogApi:
    def __init__(self, session: Any, endpoint: str | None = None, api_key: str | None = None):
        self.session = session
        self.base = (endpoint or PRODUCTION).rstrip("/")
        self.api_key = api_key

    def skus(self, service: str) -> list[dict[str, Any]]:
        """Every SKU of `service` (a service id such as respawn.prices.COMPUTE_SERVICE), all pages."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            params: dict[str, Any] = {"pageSize": PAGE_SIZE, "currencyCode": "USD"}
            if token:
                params["pageToken"] = token
            if self.api_key:
                params["key"] = self.api_key
            url = f"{self.base}/v1/services/{service}/skus"
            page = checked(self.session.request("GET", url, params=params, timeout=TIMEOUT_S), "GET", url)
            out += page.get("skus") or []
            token = page.get("nextPageToken") or ""
            if not token:
                return out


class CatalogPrices:
    """ports.PriceSource over the catalog and a Firestore cache; `clients` (respawn.control.clients.Clients) builds
    both on first use, so a deployment that never prices a node never builds them."""

    def __init__(self, api: CatalogApi | None = None, db: Any = None, clients: Any = None):
        self._api, self._db, self._clients = api, db, clients

    @property
    def api(self) -> CatalogApi:
        if self._api is None:
            self._api = self._clients.billing_catalog()
        return self._api

    @property
    def db(self) -> Any:
        if self._db is None:
            self._db = self._clients.firestore()
        return self._db

    def book(self, region: str, now: datetime) -> prices.Book:
        ref = self.db.collection(PRICES).document(region)
        snap = ref.get()
        cached = snap.to_dict() if snap.exists else None
        if cached is not None and cached.get("until") is not None and cached["until"] > now:
            if cached["source"] == "offline":  # the table itself, which says which units are another region's
                return prices.offline(region) or prices.Book(region, "offline", prices.OFFLINE_DATE, {})
            return prices.Book(region, cached["source"], cached["as_of"], dict(cached.get("rates") or {}))
        try:
            skus = self.api.skus(prices.COMPUTE_SERVICE) + self.api.skus(prices.TPU_SERVICE)
            book = prices.from_catalog(skus, region, now.date().isoformat())
            if not book.rates:
                raise LookupError(f"the catalog has no SKU Respawn prices in {region}")
            until, error = now + REFRESH, None
        except Exception as exc:  # noqa: BLE001 - any failure: the job is priced from the fallback, and says so
            error = f"{type(exc).__name__}: {exc}"[:500]
            old = (prices.Book(region, cached["source"], cached["as_of"], dict(cached.get("rates") or {}))
                   if cached and cached.get("source") == "catalog" else None)
            book = old or prices.offline(region) or prices.Book(region, "offline", prices.OFFLINE_DATE, {})
            until = now + RETRY
            logs.warning(f"prices for {region}: the Cloud Billing Catalog could not be read ({error}); using the "
                         f"{book.note} until {until.isoformat()}. The controller needs cloudbilling.googleapis.com "
                         "enabled, and RESPAWN_BILLING_API_KEY where its own credentials are refused "
                         "(docs/gcp-facts.md §24)", region=region)
        ref.set({"region": region, "source": book.source, "as_of": book.as_of, "rates": dict(book.rates),
                 "fetched_at": now, "until": until, "error": error})
        return book
