"""examples/workdir-hf/train.py with a rank that dies in the middle of one save, for
tests/test_integration_transformers.py: `python tests/hf_dies_before_vote.py RANK STEP [train.py's flags]` under
torchrun. The fault goes in through the manager's seam (its commit's exchanges): rank RANK exits (code 1) when it
would vote on step STEP, after the Trainer's files of that step are written, as a rank killed mid-save would."""

from __future__ import annotations

import os
import runpy
import sys

from fsdp_dies_before_vote import dies_before_vote  # tests/ is this script's directory
from respawn.ckpt import framework_files

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "workdir-hf", "train.py")


def main() -> int:
    rank, step, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]

    framework_files.default_seam = dies_before_vote(rank, step)  # what FilesManager takes when given no seam
    train = runpy.run_path(TRAIN)
    return train["main"](argv)


if __name__ == "__main__":
    sys.exit(main())
