"""Standard (on-demand) VMs: never preempted; host maintenance still stops a GPU VM (onHostMaintenance TERMINATE).
Through a Cloud TPU queued resource it is the on-demand request: no tier field (gcp-facts §19)."""

from __future__ import annotations

from .base import Model, register


class Standard(Model):
    name = "standard"
    label = "on-demand"
    strategy_name = "on_demand"
    capacity_pool = "standard"
    lasting = True

    def queued_tier(self) -> str | None:
        return None


STANDARD = register(Standard())
