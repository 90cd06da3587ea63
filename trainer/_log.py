"""The checkpoint library's log lines: respawn.logs' one format, on stderr (stdout is the user's trainer's), each
marked `component: trainer`."""

from __future__ import annotations

import sys
from typing import Any

from respawn import logs


def log(severity: str, message: str, **fields: Any) -> None:
    logs.log(severity, message, stream=sys.stderr, component="trainer", **fields)


def info(message: str, **fields: Any) -> None:
    log("INFO", message, **fields)


def warning(message: str, **fields: Any) -> None:
    log("WARNING", message, **fields)


def error(message: str, **fields: Any) -> None:
    log("ERROR", message, **fields)
