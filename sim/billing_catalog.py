"""The Cloud Billing Catalog's services.skus.list, as the controller reads prices: the SKUs set for a service
(SimServer.set_catalog), served a page at a time (gcp-facts §24)."""

from __future__ import annotations

import threading


class BillingCatalog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.skus: dict[str, list[dict]] = {}  # service id → its SKUs

    def set(self, service: str, skus: list[dict]) -> None:
        with self._lock:
            self.skus[service] = list(skus)

    def page(self, service: str, page_size: int, token: str) -> dict:
        """One page of `page_size` SKUs from `token` (an offset), with nextPageToken while more are left."""
        with self._lock:
            skus = self.skus.get(service, [])
        start = int(token or 0)
        page = skus[start:start + max(page_size, 1)]
        end = start + len(page)
        return {"skus": page, "nextPageToken": str(end) if end < len(skus) else ""}
