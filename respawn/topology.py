"""How many worker VMs (hosts) a Cloud TPU accelerator type has. Standard library only: the control plane, the sim
and the agent's tests use it, and nothing here may pull in a client library.

An accelerator type is `<generation>-<N>`. What N counts depends on the generation (docs/gcp-facts.md §13, from
the Cloud TPU system architecture pages and the per-generation pages, cloud.google.com/tpu/docs/v4, …/v5e, …/v5p,
…/v6e):

| generation | N counts | per worker VM | single host | example |
| --- | --- | --- | --- | --- |
| v2, v3 | TensorCores (2 per chip) | 4 chips = 8 cores | N = 8 | v2-32: 4 hosts |
| v4, v5p | TensorCores (2 per chip) | 4 chips = 8 cores | N = 8 | v4-32: 4 hosts |
| v5litepod (v5e), v6e | chips (1 core each) | 4 chips (ct5lp-hightpu-4t, ct6e-standard-4t) | N ≤ 8 | v5litepod-16: 4 |

So the rule: a slice of at most one host's worth is a single host — 8 TensorCores for v2/v3/v4/v5p; up to 8 chips for
v5e/v6e, whose single-host machine types hold 1, 4 or 8 chips — and a bigger slice has N / per-VM hosts.
"""

from __future__ import annotations

import re
from typing import Dict, Tuple

# generation → (units of N per worker VM in a multi-host slice, the largest single-host N)
_GENERATIONS: Dict[str, Tuple[int, int]] = {
    "v2": (8, 8),
    "v3": (8, 8),
    "v4": (8, 8),
    "v5p": (8, 8),
    "v5litepod": (4, 8),
    "v6e": (4, 8),
}
_TYPE = re.compile(r"^(?P<gen>[a-z0-9]+)-(?P<n>[1-9][0-9]*)$")


def tpu_hosts(accelerator_type: str) -> int:
    """The number of worker VMs of a TPU slice of `accelerator_type` (e.g. "v5litepod-16" → 4, "v4-8" → 1).
    ValueError naming the type when the generation is unknown or N is not a size that generation comes in."""
    m = _TYPE.match(accelerator_type or "")
    if m is None or m.group("gen") not in _GENERATIONS:
        known = ", ".join(f"{g}-N" for g in _GENERATIONS)
        raise ValueError(f"unknown TPU accelerator type {accelerator_type!r}: expected one of {known}")
    per_host, single_max = _GENERATIONS[m.group("gen")]
    n = int(m.group("n"))
    if n <= single_max:
        if per_host == 8 and n != 8:  # v2/v3/v4/v5p slices start at 8 TensorCores
            raise ValueError(f"unknown TPU accelerator type {accelerator_type!r}: {m.group('gen')} slices have a "
                             f"multiple of 8 TensorCores")
        return 1
    if n % per_host:
        raise ValueError(f"unknown TPU accelerator type {accelerator_type!r}: a multi-host {m.group('gen')} slice has "
                         f"a multiple of {per_host} per worker VM")
    return n // per_host


__all__ = ["tpu_hosts"]
