"""`respawn jobs logs`, the pure part: which shipped log chunks (respawn.contract.LogChunk, under
contract.logs_uri(checkpoint_uri)) to show and in what order, and the lines they make. The CLI lists and reads them
through respawn.codestore; the agent writes them (node_agent/logship.py).

Each (host, stream) is a sequence of chunks by offset. Several are merged by when each chunk was written (its
object's update time), never reordering one sequence, and each line gets the prefix `[node]` (`[node wI]` for worker
I of a multi-host slice) when more than one host wrote.
"""

from __future__ import annotations

import collections
import heapq
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from respawn import contract

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


def label(host: str) -> str:
    """`[node]`, or `[node wI]` for worker I of a multi-host slice (contract.heartbeat_id)."""
    node, sep, worker = host.rpartition("-w")
    return f"[{node} w{worker}]" if sep and worker.isdigit() else f"[{host}]"


def lines(shown: list[Shown], read: Callable[[Shown], bytes], *, prefixed: bool | None = None) -> Iterator[str]:
    """The lines of `shown` (read in that order), with the host's prefix when several hosts wrote (or `prefixed`)."""
    if prefixed is None:
        prefixed = len({s.chunk.host for s in shown}) > 1
    for s in shown:
        text = (read(s) if s.data is None else s.data).decode("utf-8", errors="replace")
        for line in text.splitlines():
            yield f"{label(s.chunk.host)} {line}" if prefixed else line


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
