"""A user's training entry point, as `respawn jobs register job.yaml --workdir examples/workdir` ships it.

The node runs it from the unpacked workdir with the job's interpreter (trainer.interpreter), after the setup
command (prepare.py) has checked the environment and written build/environment.json. It trains Respawn's example
model for the framework chosen with --framework, with DDP when started by torchrun with --ranks N (the other flags
are the example trainer's: --steps, --checkpoint-every, ...):

    python -m respawn.ckpt.launch torchrun --nproc-per-node 8 train.py --ranks 8 --steps 200

JAX on a multi-host TPU slice runs one process per worker VM, each under its worker's node agent: there the agent
sets RESPAWN_NUM_NODES to the slice's workers, and this runs the jax.distributed example, which takes its process
id and coordinator from the agent too.
"""

import argparse
import json
import os
import sys
from pathlib import Path

ENVIRONMENT = Path(__file__).resolve().parent / "build" / "environment.json"  # written by prepare.py


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--framework", choices=("torch", "jax"), default="torch")
    parser.add_argument("--ranks", type=int, default=1, help="above 1: DDP, run under torchrun (torch only)")
    args, rest = parser.parse_known_args()
    if not ENVIRONMENT.exists():
        print(f"train.py: {ENVIRONMENT} is missing: run the setup command first (python prepare.py --framework {args.framework})",
              file=sys.stderr)
        return 2
    found = json.loads(ENVIRONMENT.read_text())
    print(f"train.py: {args.framework} {found[args.framework]} on Python {found['python']}", flush=True)
    if args.framework == "torch" and args.ranks > 1:
        from respawn.ckpt.examples import torch_ddp as example
    elif args.framework == "torch":
        from respawn.ckpt.examples import torch_mlp as example
    elif int(os.environ.get("RESPAWN_NUM_NODES") or 1) > 1:  # one process per worker of a TPU slice
        from respawn.ckpt.examples import jax_multiprocess as example
    else:
        from respawn.ckpt.examples import jax_mlp as example
    return example.main(rest)


if __name__ == "__main__":
    sys.exit(main())
