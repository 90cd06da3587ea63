"""Provisioning models: the ways a job's node is obtained, each one module owning everything that differs between
them (docs/architecture.md, "Provisioning models"). Pure: no cloud library, no I/O.

A model says what its node's create body carries (Compute Engine's scheduling fields and the rest, a TPU node's
schedulingConfig), how its lifecycle reads (a run that ends on its own, a request that waits for capacity), which
loss is a preemption and which a planned stop, its capacity pool, quota pool and price key, and its names (in the
spec, in messages, in a strategy's name). The recovery strategy (recovery.py) chooses among the job's tiers; the
decision core (decide.py) asks the slot's model through the small interface below and names none of them.

Models are registered under the name a user writes in the spec (`provisioning: spot`, a tier's `model:`); a new
model is a module here that registers itself, its fields in the spec (respawn/schema.py), the sim, docs and tests.
How a TPU node is obtained when it goes through a Cloud TPU queued resource is models/queued.py (the request's
lifecycle), which decide.py reaches through `obtaining`.
"""

from __future__ import annotations

# The base and registries live in base.py, which each model imports: this package's __init__ imports the models (to
# register them), so a model importing the package would be an import cycle.
from .base import (DIRECT, RUN_END_SLACK, RUN_ENDED, ComputeFields, Model, Obtaining, all_models,
                   capacity_phrases, names, obtaining, of, register, register_way, request_way,
                   tier_of)
from . import flex_start, preemptible, queued, reservation, spot, standard  # noqa: F401 - register

__all__ = ["DIRECT", "RUN_END_SLACK", "RUN_ENDED", "ComputeFields", "Model", "Obtaining", "all_models", "capacity_phrases", "names",
           "obtaining", "of", "register", "register_way", "request_way", "tier_of"]
