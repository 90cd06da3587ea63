"""Retention: which checkpoint steps a manager deletes after a save, in the local directory and the remote store.
The newest `keep` committed steps stay, and the newest emergency one; so do local copies not uploaded yet.
"""

from __future__ import annotations

import json
from typing import Any

from . import _log, format as fmt


def plan_retention(steps: dict[int, bool], kinds: dict[int, str], keep: int, protect: set[int]) -> list[int]:
    """Steps to delete: keep the newest `keep` committed, the newest committed emergency one, and anything in
    `protect`; delete the other committed steps and every uncommitted leftover."""
    committed = sorted((s for s, c in steps.items() if c), reverse=True)
    keep_set = set(committed[:max(keep, 1)]) | set(protect)
    emergencies = [s for s in committed if kinds.get(s) == "emergency"]
    if emergencies:
        keep_set.add(emergencies[0])
    return sorted(s for s in steps if s not in keep_set)


def apply(local: Any, remote: Any, remote_committed: set[int], keep: int, protect: set[int],
          kinds: dict[tuple[str, int], str]) -> list[tuple[str, int]]:
    """Delete what plan_retention says in `local` and `remote` (None: none); local steps newer than every one
    committed remotely are kept. `kinds` caches each step's kind by (store URI, step), read from its manifest when
    unknown. Returns (store URI, step) for each step deleted."""
    removed = []
    remote_newest = max(remote_committed, default=-1)
    for store in [local] + ([remote] if remote is not None else []):
        try:
            steps = store.steps()
            step_kinds = {s: _kind(kinds, store, s) for s, c in steps.items() if c}
            extra = set()
            if store is local and remote is not None:
                extra = {s for s, c in steps.items() if c and s > remote_newest}
            for s in plan_retention(steps, step_kinds, keep, protect | extra):
                store.delete_step(s)
                removed.append((store.uri, s))
        except Exception as exc:  # noqa: BLE001 - retention is housekeeping; report and go on
            _log.warning("retention failed", store=store.uri, error=f"{type(exc).__name__}: {exc}")
    if removed:
        _log.info("retention removed checkpoints", removed=[f"{u}#{s}" for u, s in removed])
    return removed


def _kind(kinds: dict[tuple[str, int], str], store: Any, step: int) -> str | None:
    key = (store.uri, step)
    if key not in kinds:
        try:
            kinds[key] = json.loads(store.read(step, fmt.MANIFEST))["kind"]
        except Exception:  # noqa: BLE001 - unknown kind counts as periodic
            return None
    return kinds[key]
