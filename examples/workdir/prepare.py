"""The job's setup command (trainer.setup: [[python, prepare.py, --framework, torch]]): run once per node life, in
the workdir, with the trainer's interpreter, before the first trainer start. It checks that what train.py imports
is installed and records the versions in build/environment.json; a missing package fails the setup — and with it
the job, naming this command — instead of crashing the trainer on every restart.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import sys
from pathlib import Path

# module train.py imports → the distribution that provides it
NEEDED = {"torch": {"respawn.ckpt": "respawn", "numpy": "numpy", "torch": "torch"},
          "jax": {"respawn.ckpt": "respawn", "numpy": "numpy", "jax": "jax"}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=sorted(NEEDED), default="torch")
    args = parser.parse_args()
    found, missing = {"python": platform.python_version()}, []
    for module, dist in NEEDED[args.framework].items():
        if importlib.util.find_spec(module) is None:
            missing.append(dist)
        else:
            found[dist] = importlib.metadata.version(dist)
    if missing:
        print(f"prepare.py: {sys.executable} lacks {', '.join(missing)}: install it into the trainer's interpreter, "
              "e.g. with a setup command [pip, install, -r, requirements.txt] before this one", file=sys.stderr)
        return 1
    out = Path(__file__).resolve().parent / "build" / "environment.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(found, indent=2) + "\n")
    print(f"prepare.py: {json.dumps(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
