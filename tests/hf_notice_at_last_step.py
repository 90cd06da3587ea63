"""examples/workdir-hf/train.py whose last step waits for the notice, for tests/test_integration_transformers.py:
`python tests/hf_notice_at_last_step.py [train.py's flags]` under torchrun. As step max_steps begins, every rank says
`train.py[rank R]: waiting for the notice at step N` and holds the step until its own SIGTERM (the one the launch
wrapper forwards) has come, so a real notice lands inside the last step on every rank, whatever the machine's load;
the step then ends, and Respawn's step-end agreement sees the notice there."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "workdir-hf", "train.py")
PATIENCE = 300  # seconds a rank holds its last step for the notice; then it goes on (and the test fails)


def main() -> int:
    # By its path, under a name of its own; main() reads Progress from this module's globals when it runs.
    spec = importlib.util.spec_from_file_location("respawn_hf_example_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)

    class WaitsForTheNotice(train.Progress):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step != state.max_steps - 1:
                return
            noticed, respawns = threading.Event(), signal.getsignal(signal.SIGTERM)  # Respawn's flag handler

            def handler(signum, frame):  # chained before Respawn's: it sees the same signal
                noticed.set()
                respawns(signum, frame)

            signal.signal(signal.SIGTERM, handler)
            train.say(f"{self.name}: waiting for the notice at step {state.max_steps}")
            deadline = time.monotonic() + PATIENCE
            while not noticed.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)

    train.Progress = WaitsForTheNotice
    return train.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
