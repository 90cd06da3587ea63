"""The objects TrainingLoop restores in place, and the global RNGs it saves: how their state is read and put back.
Shared by the loop and the sharded torch restore (its DCP template is the objects' current state)."""

from __future__ import annotations

import random
import sys
from typing import Any, Callable

import numpy as np


def accessors(name: str, obj: Any) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """(get_state, load_state) for an object the loop restores in place."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(obj, (torch_data.DataLoader, torch_data.IterableDataset)):
        from .data import check_data

        position = check_data(name, obj)  # its batches consumed, not its workers' prefetch; a WARNING if inexact
        return position.state_dict, position.load_state_dict
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return obj.state_dict, obj.load_state_dict  # torch modules, optimizers, schedulers; DCP-style Stateful
    if callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None)):
        return obj.get_state, obj.set_state  # torch.Generator, numpy.random.RandomState
    if isinstance(obj, np.random.Generator):
        bit_generator = obj.bit_generator
        return (lambda: bit_generator.state), (lambda s: setattr(bit_generator, "state", s))
    if isinstance(obj, dict):
        return (lambda: obj), (lambda s: (obj.clear(), obj.update(s)))
    raise TypeError(f"TrainingLoop cannot restore {name}={type(obj).__name__} in place: pass an object with "
                    "state_dict()/load_state_dict() or get_state()/set_state(), a numpy Generator or a dict, "
                    "or put immutable values into state=")


def capture_rng() -> dict:
    if sys.modules.get("torch") is not None:
        from .torch_state import capture_rng

        return capture_rng()  # torch (and initialized CUDA), Python, NumPy
    return {"python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng(rng: dict) -> None:
    if "torch" in rng:
        from .torch_state import restore_rng

        restore_rng(rng)
        return
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])


def like(restored: Any, template: Any) -> Any:
    if sys.modules.get("jax") is not None:
        from .jax_state import to_template

        return to_template(restored, template)  # the template's pytree structure and shardings
    return restored
