"""The private torch helpers the sharded save and restore use, in this one module: a torch release that moves one
fails here, at import, naming it (and tests/test_trainer_compat.py with it), rather than breaking FSDP saves. DCP's
staging helpers (the periodic snapshot's reused CPU buffers), its flat keys of a nested state dict, and the creation
of an optimizer's lazy state (Adam's moments), so that a restore has tensors to load into."""

import torch

CHECKED_WITH = "torch==2.13.0"

try:
    from torch.distributed._state_dict_utils import (  # noqa: F401 - the names this module exports
        _copy_state_dict as copy_state_dict,
        _create_cpu_state_dict as create_cpu_state_dict,
    )
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # noqa: F401
    from torch.distributed.checkpoint.state_dict import _init_optim_state as init_optim_state  # noqa: F401
except ImportError as exc:
    raise ImportError(f"respawn.ckpt.torch_compat: a private torch API moved in torch {torch.__version__} ({exc}); "
                      f"it was checked with {CHECKED_WITH}: pin that version, or update trainer/torch_compat.py") from exc
