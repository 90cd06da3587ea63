"""Compute Engine's capacity advice for the controller (docs/gcp-facts.md §20): advice.capacity through the real
compute_v1.AdviceClient (REST, the client factory's endpoint), its request built as the installed type from
respawn.advice's body (an unknown field raises) and its answer read back by respawn.advice.
"""

from __future__ import annotations

import json
from typing import Any

from google.cloud import compute_v1

from respawn import advice


class AdviceReader:
    def __init__(self, clients: Any):
        """`clients`: the client factory (respawn.control.clients.Clients), which builds this adapter's peers and so is
        not imported here (as in every adapter)."""
        self.clients = clients

    def capacity(self, zone: str, shape: advice.Shape, size: int) -> advice.ZoneAdvice | None:
        """The scores of `size` Spot VMs of `shape` in `zone`, or None when the answer has none for it; raises the
        client's exception (404 where the API is not served, 403 without compute.advice.capacity)."""
        body = compute_v1.CapacityAdviceRequest.from_json(json.dumps(advice.capacity_request(shape, zone, size)),
                                                          ignore_unknown_fields=False)
        answer = self.clients.advice().capacity(project=self.clients.project, region=advice.region_of(zone),
                                                capacity_advice_request_resource=body)
        return advice.parse_capacity(json.loads(type(answer).to_json(answer)), zone)
