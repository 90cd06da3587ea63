"""`python -m respawn.ckpt upload-pending LOCAL_DIR CHECKPOINT_URI`: upload the committed checkpoints a previous
life of this node left only on its local disk (upload_pending). `python -m respawn.ckpt prefetch LOCAL_DIR
CHECKPOINT_URI`: copy the newest committed step to the local disk (prefetch). The node agent runs them as child
processes, so that the agent itself never imports the checkpoint library, its storage client or NumPy."""

from __future__ import annotations

import sys

from respawn.logs import log

USAGE = "usage: python -m respawn.ckpt {upload-pending|prefetch} LOCAL_DIR CHECKPOINT_URI"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("upload-pending", "prefetch"):
        print(USAGE, file=sys.stderr)
        return 2
    from .manager import prefetch, upload_pending

    if argv[0] == "prefetch":
        step = prefetch(argv[1], argv[2])
        log("INFO", "prefetch done", step=step, checkpoint_uri=argv[2], local_dir=argv[1])
        return 0
    steps = upload_pending(argv[1], argv[2])
    log("INFO", "previous-life upload done", uploaded_steps=steps, checkpoint_uri=argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
