"""Posting a message to the Slack incoming webhook: retry 429 and 5xx with backoff (honouring Retry-After),
drop any other 4xx with a log line (retrying cannot fix a revoked URL or a bad payload)."""

from __future__ import annotations

import time
from typing import Any

import requests

from respawn import logs


class SlackUnavailable(RuntimeError):
    """Slack kept answering 429/5xx (or could not be reached): raise so the platform redelivers later."""


def post(url: str, payload: dict[str, Any], *, attempts: int = 4, backoff: float = 1.0, timeout: float = 10,
         session: requests.Session | None = None) -> bool:
    """True: Slack took it. False: dropped (4xx). SlackUnavailable: still failing after `attempts`."""
    http = session or requests
    last = ""
    for i in range(attempts):
        try:
            r = http.post(url, json=payload, timeout=timeout)
        except requests.RequestException as exc:
            last = f"cannot reach the webhook: {exc}"
        else:
            if r.status_code == 200:
                return True
            body = r.text[:200]
            if r.status_code != 429 and r.status_code < 500:
                logs.error(f"Slack refused the alert with HTTP {r.status_code} ({body}); dropped: check the webhook "
                           "URL secret and the payload", status=r.status_code)
                return False
            last = f"HTTP {r.status_code} ({body})"
            retry_after = r.headers.get("Retry-After")
            if retry_after and retry_after.isdigit() and i + 1 < attempts:
                time.sleep(min(float(retry_after), 30.0))
                continue
        if i + 1 < attempts:
            time.sleep(backoff * (2 ** i))
    raise SlackUnavailable(f"Slack webhook still failing after {attempts} attempts: {last}")
