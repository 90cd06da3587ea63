"""The job's setup command (trainer.setup: [[python, prepare.py]]): run once per node life, in the workdir, with the
trainer's interpreter. It checks that what train.py imports is installed, without importing it (a second or two,
not Lightning's import), so that a missing package fails the setup, naming this command, instead of crashing the
trainer on every restart."""

import importlib.metadata
import importlib.util
import sys

NEEDED = {"lightning": "lightning", "torchdata": "torchdata", "torch": "torch", "respawn.ckpt": "respawn"}


def main() -> int:
    missing = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        print(f"prepare.py: {sys.executable} lacks {', '.join(missing)}: install requirements.txt into the "
              "trainer's interpreter first (a setup command [python, -m, pip, install, -r, requirements.txt])",
              file=sys.stderr)
        return 1
    print("prepare.py: " + ", ".join(f"{d} {importlib.metadata.version(d)}" for d in NEEDED.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
