"""Streaming checksums for checkpoint files.

crc32c (the checksum GCS itself uses) when the google-crc32c C extension is present, zlib's crc32 otherwise. The
manifest records which one wrote it, so either side can verify either kind.
"""

from __future__ import annotations

import zlib


def _crc32c_c():
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c if getattr(google_crc32c, "implementation", "") == "c" else None


_CRC32C = _crc32c_c()
DEFAULT_ALGORITHM = "crc32c" if _CRC32C is not None else "crc32"


class Checksum:
    """An incremental checksum; `update` releases the GIL on large buffers in both implementations."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self.algorithm = algorithm
        self._value = 0
        if algorithm == "crc32c":
            import google_crc32c  # the pure-python fallback is slow but correct for verifying foreign checkpoints

            self._mod = google_crc32c
        elif algorithm == "crc32":
            self._mod = None
        else:
            raise ValueError(f"unknown checksum algorithm {algorithm!r}: expected crc32c or crc32")

    def update(self, data) -> None:
        if self._mod is not None:
            # The C extension only takes `bytes` ("y#"): one memcpy per chunk, still faster than zlib's crc32.
            self._value = self._mod.extend(self._value, data if isinstance(data, bytes) else bytes(data))
        else:
            self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value & 0xFFFFFFFF:08x}"


def of_bytes(data: bytes, algorithm: str = DEFAULT_ALGORITHM) -> str:
    c = Checksum(algorithm)
    c.update(data)
    return c.hexdigest()


def of_file(path: str, algorithm: str = DEFAULT_ALGORITHM, chunk: int = 16 << 20) -> tuple[int, str]:
    """(size, checksum) of a file, read in large chunks without extra copies."""
    c = Checksum(algorithm)
    size = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            c.update(view[:n])
            size += n
    return size, c.hexdigest()
