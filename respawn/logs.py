"""Structured logs: one JSON object per line with `severity` and `message` (Cloud Logging reads these as entries)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


def log(severity: str, message: str, *, stream: TextIO | None = None, **fields: Any) -> None:
    entry = {"severity": severity, "message": message, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    entry.update(fields)
    out = stream or sys.stdout
    out.write(json.dumps(entry, default=str) + "\n")
    out.flush()


def info(message: str, **fields: Any) -> None:
    log("INFO", message, **fields)


def warning(message: str, **fields: Any) -> None:
    log("WARNING", message, **fields)


def error(message: str, **fields: Any) -> None:
    log("ERROR", message, **fields)
