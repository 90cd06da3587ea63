"""examples/workdir-hf/train.py with a rank that dies in the middle of one save, for
tests/test_integration_transformers.py: `python tests/hf_dies_before_vote.py RANK STEP [train.py's flags]` under
torchrun. The fault goes in through the manager's seam (its commit's exchanges): rank RANK exits (code 1) when it
would vote on step STEP, after the Trainer's files of that step are written, as a rank killed mid-save would."""

from __future__ import annotations

import os
import runpy
import sys

from respawn.ckpt import commit, framework_files
from respawn.ckpt.torch_sharded import GroupSeam

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "workdir-hf", "train.py")


def main() -> int:
    rank, step, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]

    class DiesBeforeVote(GroupSeam):
        def all_gather(self, key, data, control=None):
            if self.rank == rank and key == commit.votes_key(step):
                os._exit(1)
            return super().all_gather(key, data, control)

    framework_files.default_seam = DiesBeforeVote  # what FilesManager takes when given no seam
    train = runpy.run_path(TRAIN)
    return train["main"](argv)


if __name__ == "__main__":
    sys.exit(main())
