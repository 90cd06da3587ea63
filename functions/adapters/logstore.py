"""Log retention (issue #27): the controller's scheduled sweep deletes each job's shipped log chunks
(respawn.contract.LogChunk, under {checkpoint_uri}/.respawn-logs/) once they are older than the job's
logs.retention_days. One listing of the job's own logs prefix a day (respawn.joblogs.retention_due picks the tick),
then one delete per expired chunk; nothing outside that prefix is listed or deleted.

LogObjectsApi is the Cloud Storage JSON API's objects.list / objects.delete over an authorized session
(respawn.control.clients builds it); a file:/// checkpoint_uri (local runs: the demo) is a directory.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from google.api_core import exceptions as gexc

from respawn import contract, joblogs
from respawn.contract import StoreUri

from .managed_folders import StorageJsonApi


class LogObjectsApi(StorageJsonApi):
    def list(self, bucket: str, prefix: str) -> list[dict]:
        """Every object whose name starts with `prefix`: its name and updated (RFC 3339), page after page."""
        items, token = [], None
        while True:
            params = {"prefix": prefix, "fields": "items(name,updated),nextPageToken"}
            if token:
                params["pageToken"] = token
            page = self._call("GET", f"{self.base}/{quote(bucket, safe='')}/o", params=params)
            items.extend(page.get("items") or [])
            token = page.get("nextPageToken")
            if not token:
                return items

    def delete(self, bucket: str, name: str) -> None:
        self._call("DELETE", f"{self.base}/{quote(bucket, safe='')}/o/{quote(name, safe='')}")


class LogRetention:
    def __init__(self, clients: Any):
        self.clients = clients

    def listed(self, checkpoint_uri: str) -> list[joblogs.Listed]:
        base = StoreUri.parse(contract.logs_uri(checkpoint_uri))
        if base.local_path is not None:
            return joblogs.list_local(base.local_path)
        from datetime import datetime

        under = base.path
        api = self.clients.log_objects()
        return [joblogs.Listed(item["name"][len(under):], 0, datetime.fromisoformat(
            item["updated"].replace("Z", "+00:00")).timestamp()) for item in api.list(base.bucket, under)]

    def expire(self, checkpoint_uri: str, retention_days: int, now: float) -> int:
        """Delete the job's chunks older than `retention_days`; how many went. An object already gone is not an
        error (two sweeps at once)."""
        base = StoreUri.parse(contract.logs_uri(checkpoint_uri))
        names = joblogs.expired(self.listed(checkpoint_uri), now, retention_days)
        if base.local_path is not None:
            for name in names:
                try:
                    os.unlink(os.path.join(base.local_path, name))
                except FileNotFoundError:
                    pass
            return len(names)
        api = self.clients.log_objects()
        for name in names:
            try:
                api.delete(base.bucket, base.path + name)
            except gexc.NotFound:
                pass
        return len(names)
