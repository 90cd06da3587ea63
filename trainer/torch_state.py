"""PyTorch helpers: gather model/optimizer/scheduler/RNG/data-position into one state for CheckpointManager,
and put a restored state back. Importing this module imports torch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict:
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def torch_state(model=None, optimizer=None, scheduler=None, *, data: Any = None, extra: Any = None,
                generators: dict | None = None) -> dict:
    """A checkpointable state. `data` is the data position (anything picklable or tensors); `generators`
    maps names to torch.Generator objects whose states are saved too."""
    state: dict[str, Any] = {"rng": capture_rng()}
    if model is not None:
        state["model"] = model.state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if generators:
        state["generators"] = {k: g.get_state() for k, g in generators.items()}
    state["data"] = data
    state["extra"] = extra
    return state


def load_torch_state(state: dict, model=None, optimizer=None, scheduler=None, *,
                     generators: dict | None = None) -> dict:
    """Put a restored state back into the objects; returns the state (for its `data` and `extra`)."""
    if model is not None:
        model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    for k, g in (generators or {}).items():
        g.set_state(state["generators"][k])
    restore_rng(state["rng"])
    return state
