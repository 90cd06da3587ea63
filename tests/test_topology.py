"""respawn.topology: how many worker VMs a Cloud TPU accelerator type has (docs/gcp-facts.md §13)."""

from __future__ import annotations

import pytest

from respawn.topology import tpu_hosts


@pytest.mark.parametrize("accelerator, hosts", [
    # v5e/v6e: N counts chips; up to 8 chips on one host, 4 chips per worker VM beyond
    ("v5litepod-1", 1), ("v5litepod-4", 1), ("v5litepod-8", 1), ("v5litepod-16", 4), ("v5litepod-32", 8),
    ("v5litepod-256", 64), ("v6e-8", 1), ("v6e-16", 4), ("v6e-256", 64),
    # v2/v3/v4/v5p: N counts TensorCores, 2 per chip, 4 chips (8 cores) per worker VM
    ("v2-8", 1), ("v2-32", 4), ("v3-8", 1), ("v3-128", 16), ("v4-8", 1), ("v4-16", 2), ("v4-32", 4),
    ("v4-4096", 512), ("v5p-8", 1), ("v5p-32", 4),
])
def test_hosts_per_accelerator_type(accelerator, hosts):
    assert tpu_hosts(accelerator) == hosts


@pytest.mark.parametrize("accelerator", ["", "v9-8", "v5litepod", "v5litepod-0", "v5litepod-18", "v4-4", "v4-12",
                                         "V5LITE_POD-4x4", "nvidia-l4", "v5litepod-016"])
def test_unknown_types_are_refused_by_name(accelerator):
    with pytest.raises(ValueError, match="unknown TPU accelerator type") as info:
        tpu_hosts(accelerator)
    assert repr(accelerator) in str(info.value)
