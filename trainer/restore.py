"""The search every manager's restore runs: the committed steps in the local directory and the remote store, newest
first, each opened (and its checksums verified) until one does, falling back past torn and corrupt ones; and the
error when none does.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from . import _log, format as fmt


def committed_steps(local: Any, remote: Any) -> tuple[set[int], set[int]]:
    """The committed steps in `local` and in `remote` (None: none); a remote store that cannot be listed counts as
    empty (the local copies may still do). Uncommitted steps newer than all of them are logged: a torn or
    interrupted save."""
    listing = {local: local.steps()}
    if remote is not None:
        try:
            listing[remote] = remote.steps()
        except Exception as exc:  # noqa: BLE001 - local copies may still do
            _log.error("cannot list the remote checkpoint store; trying local copies only",
                       remote=remote.uri, error=f"{type(exc).__name__}: {exc}")
    committed = {store: {s for s, c in steps.items() if c} for store, steps in listing.items()}
    newest = max(set().union(*committed.values()), default=-1)
    for store, steps in listing.items():
        for s in sorted((s for s, c in steps.items() if not c and s > newest), reverse=True):
            _log.warning("checkpoint has no commit marker (torn or interrupted save); falling back to an "
                         "older one", step=s, store=store.uri)
    return committed[local], set(committed.get(remote, ()))


def verified_steps(local: Any, remote: Any, committed: tuple[set[int], set[int]],
                   open_step: Callable[[Any, int], Any], only: int | None, started: float) -> Iterator[tuple]:
    """(step, store, open_step(store, step)) for each of the `committed` steps (committed_steps) that opens, newest
    first, the local copy before the remote one (`only`: that step alone). A step that does not open (torn,
    corrupt, unreadable) is logged and the next older one tried. Past the last: NotRestorable if a committed step
    failed to open (training must not start over at step 0 unnoticed), else a log line that there was none, with
    the seconds since `started` (time.monotonic())."""
    in_local, in_remote = committed
    failed: dict[int, str] = {}
    for step in sorted((s for s in in_local | in_remote if only is None or s == only), reverse=True):
        for store in ([local] if step in in_local else []) + ([remote] if step in in_remote else []):
            try:
                opened = open_step(store, step)
            except fmt.NotRestorable:
                raise
            except Exception as exc:  # noqa: BLE001 - corrupt, torn or unreadable: the next copy or step
                failed[step] = str(exc) if isinstance(exc, fmt.CorruptCheckpoint) else f"{type(exc).__name__}: {exc}"
                _log.warning("checkpoint unusable; falling back to an older one", step=step, store=store.uri,
                             reason=failed[step])
                continue
            yield step, store, opened
            break
    if failed:
        raise unrestorable(failed, local.uri, remote.uri if remote else None)
    _log.info("no committed checkpoint found; starting from scratch", local=local.uri,
              remote=remote.uri if remote else None, seconds=round(time.monotonic() - started, 3))


def unrestorable(failed: dict[int, str], local: str, remote: str | None) -> fmt.NotRestorable:
    """The error for committed steps none of which restored: training must not start over at step 0 unnoticed."""
    newest = max(failed)
    return fmt.NotRestorable(
        f"no committed checkpoint could be restored (newest: step {newest}: {failed[newest]}; also tried steps "
        f"{sorted(failed, reverse=True)[1:] or 'none'}) in {local}" + (f" and {remote}" if remote else "") +
        "; starting at step 0 would lose them: fix the store (a transient read error: just restart), or move those "
        "step directories away to start over")
