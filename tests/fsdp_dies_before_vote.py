"""trainer/examples/torch_fsdp.py with a rank that dies in the middle of one save, for tests/test_trainer_sharded.py:
`python tests/fsdp_dies_before_vote.py RANK STEP [the example's flags]` under torchrun. The fault goes in through the
manager's seam (its commit's exchanges): rank RANK exits (code 1) when it would vote on step STEP, after its DCP
write, as a rank killed mid-save would."""

from __future__ import annotations

import os
import sys

from respawn.ckpt import commit
from respawn.ckpt.examples import torch_fsdp
from respawn.ckpt.torch_sharded import GroupSeam


def dies_before_vote(rank: int, step: int) -> type[GroupSeam]:
    """A GroupSeam whose rank `rank` exits (code 1) when it would vote on step `step`."""

    class DiesBeforeVote(GroupSeam):
        def all_gather(self, key, data, control=None):
            if self.rank == rank and key == commit.votes_key(step):
                os._exit(1)
            return super().all_gather(key, data, control)

    return DiesBeforeVote


def main() -> int:
    rank, step, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    return torch_fsdp.main(argv, seam=dies_before_vote(rank, step))


if __name__ == "__main__":
    sys.exit(main())
