"""What the adapters that speak a Google JSON API over an HTTP session (managed folders, the Cloud Billing
Catalog) share: an error answer raised as the client libraries raise it, so that placement.classify and the
callers read one shape."""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc


def checked(r: Any, method: str, url: str) -> dict:
    """The answer's JSON (empty: {}); an HTTP error raises google.api_core's exception of its status, with the
    API's message (or the start of the body)."""
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:300]
        raise gexc.from_http_status(r.status_code, f"{method} {url}: {message}")
    return r.json() if r.content else {}
