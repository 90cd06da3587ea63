"""Structured logs: one JSON object per line with `severity` and `message` (Cloud Logging reads these as entries).

A process may set labels that every later line carries in the field LABELS_FIELD, which Cloud Logging's agents
turn into the entry's `labels` (docs/gcp-facts.md §22): the node agent labels its lines with the job, attempt, node
and rank, so one filter finds a job's lines across all its nodes.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, TextIO


LABELS_FIELD = "logging.googleapis.com/labels"
_labels: dict[str, str] = {}


def set_labels(**labels: Any) -> None:
    """Label every later line of this process (added to, or changed: a label set to None is dropped)."""
    for key, value in labels.items():
        if value is None:
            _labels.pop(key, None)
        else:
            _labels[key] = str(value)  # Cloud Logging's labels are strings


def labels() -> dict[str, str]:
    """The labels this process's lines carry now."""
    return dict(_labels)


def now() -> str:
    """The `time` of a line: RFC 3339 in UTC, to the millisecond (what Cloud Logging reads as the entry's time)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log(severity: str, message: str, *, stream: TextIO | None = None, **fields: Any) -> None:
    """One line on `stream` (stdout by default). A closed stream (its reader went away) drops the line: logging must
    never break the caller (a save, a recovery)."""
    entry = {"severity": severity, "message": message, "time": now()}
    entry.update(fields)
    if _labels:
        entry[LABELS_FIELD] = dict(_labels)
    out = stream or sys.stdout
    try:
        out.write(json.dumps(entry, default=str) + "\n")
        out.flush()
    except (OSError, ValueError):
        pass


def info(message: str, **fields: Any) -> None:
    log("INFO", message, **fields)


def warning(message: str, **fields: Any) -> None:
    log("WARNING", message, **fields)


def error(message: str, **fields: Any) -> None:
    log("ERROR", message, **fields)


def one_line(what: BaseException | str, limit: int = 400) -> str:
    """An error's text on one line, as every failure is told (a library's message may span several lines; each is
    kept, joined by "; "), cut at `limit` characters; an exception without text is named by its type."""
    text = "; ".join(" ".join(line.split()) for line in str(what).splitlines() if line.strip())
    if not text and isinstance(what, BaseException):
        text = type(what).__name__
    return text if len(text) <= limit else text[:limit] + "..."
