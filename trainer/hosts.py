"""Which ranks of a job share a checkpoint directory: ranks on one machine do, hosts with their own disks do not.

Each rank writes a token of its own into the local directory, the tokens are exchanged (an all-gather: the ranks'
files are all written before any rank reads), and each rank reports the ranks whose token it can read back there.
A shared filesystem mounted on several hosts counts as shared, as it is. The answer decides the commit protocol
(commit.py): one directory for the job → commit there, then upload; several → every
host uploads its own files and the commit is written in the remote store.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Callable

PROBE_DIR = ".respawn-hosts"


def shared_groups(root: str, rank: int, exchange: Callable[[bytes], list[bytes]]) -> list[list[int]]:
    """The ranks grouped by the directory they see at `root`, each group sorted, groups by their lowest rank.
    exchange(mine) -> every rank's bytes, in rank order (a collective: every rank calls it twice)."""
    probe = os.path.join(root, PROBE_DIR)
    os.makedirs(probe, exist_ok=True)
    token = uuid.uuid4().hex
    path = os.path.join(probe, str(rank))
    with open(path, "w") as f:
        f.write(token)
    try:
        tokens = [t.decode() for t in exchange(token.encode())]
        seen = []
        for other, want in enumerate(tokens):
            try:
                with open(os.path.join(probe, str(other))) as f:
                    if f.read() == want:
                        seen.append(other)
            except FileNotFoundError:
                pass
        views = [json.loads(v) for v in exchange(json.dumps(seen).encode())]
    finally:
        os.remove(path)  # every rank has read it: the second exchange is past
    groups = sorted({tuple(v) for v in views})
    for g in groups:
        for r in g:
            if views[r] != list(g):
                raise RuntimeError(f"ranks disagree on who shares the checkpoint directory {root}: rank {r} sees "
                                   f"{views[r]}, rank {g[0]} sees {list(g)}")
    return [list(g) for g in groups]


def per_host(groups: list[list[int]], has_remote: bool, members: str) -> bool:
    """Whether the job's members (`members`: "ranks", "processes") write to separate directories, which makes
    every member upload its own files and the commit go to the remote store; ValueError when there is none."""
    if len(groups) > 1 and not has_remote:
        raise ValueError(f"the {members} write to {len(groups)} separate checkpoint directories ({members} by host: "
                         f"{groups}) and there is no remote store: give every host the same checkpoint_uri "
                         "(gs://BUCKET/PREFIX, or RESPAWN_CHECKPOINT_URI) for the job's commits")
    return len(groups) > 1
