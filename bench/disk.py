"""The disk's own speed, which the checkpoint benchmarks (bench.checkpoint, bench.checkpoint_distributed) set their
saves against: sequential 8 MiB writes of SIZE bytes and one fsync, on the same disk as the saves."""

from __future__ import annotations

import os
import time


def raw_write(path: str, size: int, chunk: int = 8 << 20) -> float:
    buf = os.urandom(chunk)
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = size
        while left > 0:
            n = f.write(buf[:min(chunk, left)])
            left -= n
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.remove(path)
    return size / dt / 1e6
