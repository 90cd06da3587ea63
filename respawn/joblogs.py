"""`respawn jobs logs`, the pure part: which shipped log chunks (respawn.contract.LogChunk, under
contract.logs_uri(checkpoint_uri)) to show and in what order, and the lines they make. The CLI lists and reads them
through respawn.app.codestore; the agent writes them (node_agent/logship.py).

Each (host, stream) is a sequence of chunks by offset. Several are merged by when each chunk was written (its
object's update time), never reordering one sequence, and each line gets the prefix `[node]` (`[node wI]` for worker
I of a multi-host slice) when more than one host wrote.
"""

from __future__ import annotations

import collections
import heapq
import os
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from . import contract

DEFAULT_STREAMS = ("setup", "trainer")  # what the user's code said; the agent's own lines on request


@dataclass(frozen=True)
class Listed:
    """One object below logs_uri(checkpoint_uri): its name there, size and update time (seconds since the epoch)."""

    name: str
    size: int
    updated: float


@dataclass(frozen=True)
class Shown:
    chunk: contract.LogChunk
    listed: Listed
    data: bytes | None = None  # read already


class NoLogs(Exception):
    """Nothing to show, said so that the user knows why and what to do."""


def list_local(root: str, prefix: str = "") -> list[Listed]:
    """The files below the directory `root` (a file:/// store) whose names there start with `prefix`."""
    found = []
    for folder, _, files in os.walk(os.path.join(root, prefix)):
        for f in files:
            path = os.path.join(folder, f)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # replaced meanwhile (a temporary name renamed into place)
            found.append(Listed(os.path.relpath(path, root), st.st_size, st.st_mtime))
    return found


def select(listed: Iterable[Listed], *, job_id: str, where: str, attempt: int | None = None,
           node: str | None = None, streams: Iterable[str] = DEFAULT_STREAMS,
           attempts: Iterable[int] = ()) -> list[Shown]:
    """The chunks to show, merged in the order they were written. NoLogs when there are none, naming what exists
    (`attempts`: the attempts that have logs, when `listed` holds only `attempt`'s)."""
    chunks = [Shown(c, item) for item in listed if (c := contract.LogChunk.parse(item.name)) is not None]
    if not chunks and attempt is not None and attempts:
        raise NoLogs(f"attempt {attempt} of job {job_id!r} has no logs; attempts with logs: "
                     f"{', '.join(map(str, attempts))}")
    if not chunks:
        raise NoLogs(f"job {job_id!r} has no logs under {where}: its nodes ship them there as they run (an agent "
                     "older than this feature does not); check the job's checkpoint_uri with `respawn jobs describe "
                     f"{job_id}`")
    if attempt is not None:
        chunks = [s for s in chunks if s.chunk.attempt == attempt]
    if node is not None:
        hosts = sorted({s.chunk.host for s in chunks})
        chunks = [s for s in chunks if s.chunk.host == node or s.chunk.host.startswith(node + "-w")]
        if not chunks:
            raise NoLogs(f"no logs of node {node!r} in job {job_id!r}" + (f" attempt {attempt}" if attempt else "")
                         + f"; nodes with logs: {', '.join(hosts)}")
    wanted = set(streams)
    chunks = [s for s in chunks if s.chunk.stream in wanted]
    return merge(chunks)


def merge(chunks: list[Shown]) -> list[Shown]:
    """One sequence per (host, stream) by offset; the sequences interleaved by update time."""
    sequences: dict[tuple[str, str], list[Shown]] = {}
    for s in sorted(chunks, key=lambda s: (s.chunk.host, s.chunk.stream, s.chunk.offset)):
        sequences.setdefault((s.chunk.host, s.chunk.stream), []).append(s)
    heads = [(seq[0].listed.updated, key, 0) for key, seq in sequences.items()]
    heapq.heapify(heads)
    out = []
    while heads:
        _, key, i = heapq.heappop(heads)
        seq = sequences[key]
        out.append(seq[i])
        if i + 1 < len(seq):
            heapq.heappush(heads, (seq[i + 1].listed.updated, key, i + 1))
    return out


def label(host: str, hosts: Iterable[str] = ()) -> str:
    """`[node]`, or `[node wI]` for worker I of a multi-host slice (contract.heartbeat_id; worker 0 writes as the
    node itself, and is `[node w0]` where other `hosts` of its slice wrote)."""
    node, sep, worker = host.rpartition("-w")
    if sep and worker.isdigit():
        return f"[{node} w{worker}]"
    return f"[{host} w0]" if any(h.startswith(host + "-w") for h in hosts) else f"[{host}]"


def lines(shown: Iterable[Shown], read: Callable[[Shown], bytes], *, hosts: set[str] | None = None) -> Iterator[str]:
    """The lines of `shown` (read in that order), each with its host's prefix when several `hosts` wrote (default:
    those of `shown`; --follow passes every host seen so far)."""
    if hosts is None:
        shown = list(shown)
        hosts = {s.chunk.host for s in shown}
    prefixed = len(hosts) > 1
    for s in shown:
        text = (read(s) if s.data is None else s.data).decode("utf-8", errors="replace")
        for line in text.splitlines():
            yield f"{label(s.chunk.host, hosts)} {line}" if prefixed else line


READ_AHEAD = 16  # chunks read at once: a long job is thousands of small objects, each one GET


def read_ahead(shown: list[Shown], read: Callable[[Shown], bytes], workers: int = READ_AHEAD) -> Iterator[Shown]:
    """`shown` in order, each read (`data`), READ_AHEAD at a time in threads and no more than a few windows ahead
    of what was taken, so memory stays bounded whatever the job's length."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(shown), workers * 4):
            window = shown[start:start + workers * 4]
            for s, data in zip(window, pool.map(read, window)):
                yield Shown(s.chunk, s.listed, data)


FOLLOW_IDLE_S = 600.0  # --follow stops listing an attempt that wrote nothing for this long (its node is gone)


def follow_attempts(attempts: Iterable[int], written: dict[int, float], now: float,
                    idle_s: float = FOLLOW_IDLE_S) -> list[int]:
    """The attempts --follow lists again: new ones, and those whose newest chunk (`written`) is recent. A long job
    has many attempts of thousands of chunks each, and only the current nodes' still grow."""
    return [a for a in attempts if a not in written or now - written[a] < idle_s]


def last_chunks(shown: list[Shown], read: Callable[[Shown], bytes], k: int) -> list[Shown]:
    """The fewest last chunks of `shown` that hold its last `k` lines, each read once (`read` is then answered from
    what was read, for lines())."""
    kept: list[Shown] = []
    count = 0
    for s in reversed(shown):
        data = read(s)
        kept.append(Shown(s.chunk, s.listed, data))
        count += len(data.splitlines())
        if count >= k:
            break
    return kept[::-1]


def tail(it: Iterable[str], k: int) -> list[str]:
    return list(collections.deque(it, maxlen=k))


# ---- retention (the controller's scheduled sweep; functions/adapters/logstore.py lists and deletes) --------------

DAY_S = 86400.0


def expired(listed: Iterable[Listed], now: float, retention_days: int) -> list[str]:
    """The chunks written more than `retention_days` before `now` (seconds since the epoch); nothing else below the
    logs' prefix is ever named, whatever its age."""
    cutoff = now - retention_days * DAY_S
    return [item.name for item in listed if contract.LogChunk.parse(item.name) is not None and item.updated < cutoff]


def retention_due(job_id: str, now: float, period_s: float) -> bool:
    """Whether the scheduled sweep at `now`, one every `period_s`, expires `job_id`'s logs: each job has a fixed
    moment of the day (from a hash of its id, so jobs spread over the day) and the one tick in whose period it falls
    does it. So at most once a day per job, with no record to keep; a tick that does not come skips that day."""
    moment = zlib.crc32(job_id.encode()) % int(DAY_S)
    into_day = now % DAY_S
    return 0 <= (into_day - moment) % DAY_S < period_s
