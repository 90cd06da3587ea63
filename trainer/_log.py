"""Structured logs for the trainer library: one JSON object per line on stderr with `severity` and `message`.

Kept inside trainer/ on purpose: the library must not depend on the rest of the repository.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def log(severity: str, message: str, **fields: Any) -> None:
    entry = {"severity": severity, "message": message, "time": round(time.time(), 3), "component": "trainer"}
    entry.update(fields)
    try:
        sys.stderr.write(json.dumps(entry, default=str) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        # stderr closed (e.g. the agent went away): logging must never break a save.
        pass


def info(message: str, **fields: Any) -> None:
    log("INFO", message, **fields)


def warning(message: str, **fields: Any) -> None:
    log("WARNING", message, **fields)


def error(message: str, **fields: Any) -> None:
    log("ERROR", message, **fields)
