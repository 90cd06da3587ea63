"""Write one Firestore document through the REST API (v1 `documents:commit`), and read one field of one.

The agent writes exactly one kind of thing (its heartbeat) and reads one (the state in its predecessor's, on a node
created during that one's notice: agent.py, the handover), so a few dozen lines of REST replace
google-cloud-firestore, whose import alone takes the process to about 61 MB resident (measured; see README).
The document written is the same one the Python client reads: integers, timestamps, maps and nulls map to the
same Firestore value types.

Endpoints: with FIRESTORE_EMULATOR_HOST set (local runs), http://HOST/v1/ with the emulator's owner token;
otherwise https://firestore.googleapis.com/v1/ with an access token for the VM's service account from the
metadata server.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from respawn.contract import NODES_DATABASE

from . import _http
from .metadata import MetadataClient, ServiceAccountToken, TokenError

PRODUCTION_ROOT = "https://firestore.googleapis.com/v1/"


class FirestoreError(Exception):
    pass


def encode_value(value: Any) -> dict[str, Any]:
    """A Python value as a Firestore REST Value."""
    if value is None:
        return {"nullValue": None}
    if isinstance(value, bool):
        return {"booleanValue": value}
    if isinstance(value, int):
        return {"integerValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return {"timestampValue": value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")}
    if isinstance(value, dict):
        return {"mapValue": {"fields": {str(k): encode_value(v) for k, v in value.items()}}}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [encode_value(v) for v in value]}}
    if hasattr(value, "value"):  # enums such as NodeState
        return encode_value(value.value)
    raise TypeError(f"cannot store a {type(value).__name__} in Firestore")


class _FirestoreToken:
    """The service account's token; a failure to get one is a FirestoreError like any failed write."""

    def __init__(self, md: MetadataClient):
        self._token = ServiceAccountToken(md)

    def get(self) -> str:
        try:
            return self._token.get()
        except TokenError as exc:
            raise FirestoreError(str(exc)) from None


class FirestoreWriter:
    def __init__(self, project: str, md: MetadataClient | None = None, *, emulator_host: str | None = None,
                 database: str = NODES_DATABASE):
        emulator_host = emulator_host if emulator_host is not None else os.environ.get("FIRESTORE_EMULATOR_HOST")
        self.project = project
        self.db_path = f"projects/{project}/databases/{database}"
        if emulator_host:
            self.root = f"http://{emulator_host}/v1/"
            self._token = None
        else:
            self.root = PRODUCTION_ROOT
            self._token = _FirestoreToken(md or MetadataClient())

    def _headers(self) -> dict[str, str]:
        # The emulator accepts this fixed token as an administrator and skips security rules.
        return {"Content-Type": "application/json",
                "Authorization": f"Bearer {self._token.get() if self._token else 'owner'}"}

    def get_string(self, collection: str, doc_id: str, field: str, *, timeout: float = 10.0) -> str | None:
        """One string field of a document (v1 `documents.get` with a field mask); None when the document or the
        field does not exist."""
        url = f"{self.root}{self.db_path}/documents/{collection}/{doc_id}?mask.fieldPaths={field}"
        resp = _http.request("GET", url, headers=self._headers(), timeout=timeout)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise FirestoreError(f"Firestore get of {collection}/{doc_id} answered HTTP {resp.status}: "
                                 f"{resp.text()[:300]}")
        try:
            value = json.loads(resp.body).get("fields", {}).get(field)
        except (ValueError, AttributeError):
            raise FirestoreError(f"Firestore get of {collection}/{doc_id} answered no document: "
                                 f"{resp.text()[:300]}") from None
        return value.get("stringValue") if isinstance(value, dict) else None

    def set(self, collection: str, doc_id: str, fields: dict[str, Any], *, server_timestamps: tuple[str, ...] = (),
            timeout: float = 10.0) -> None:
        """Replace the whole document; each field named in `server_timestamps` gets the commit time."""
        write = {
            "update": {
                "name": f"{self.db_path}/documents/{collection}/{doc_id}",
                "fields": {k: encode_value(v) for k, v in fields.items() if k not in server_timestamps},
            },
            "updateTransforms": [{"fieldPath": f, "setToServerValue": "REQUEST_TIME"} for f in server_timestamps],
        }
        url = f"{self.root}{self.db_path}/documents:commit"
        resp = _http.request("POST", url, body=json.dumps({"writes": [write]}).encode(), headers=self._headers(),
                             timeout=timeout)
        if resp.status != 200:
            raise FirestoreError(f"Firestore commit of {collection}/{doc_id} answered HTTP {resp.status}: "
                                 f"{resp.text()[:300]}")
