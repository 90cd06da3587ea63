"""The baseline of bench/controller.py: the seed documents' restart function, deployed as a Cloud Function.

Per preemption event: wait (the seeds sleep 60 s "for the instance to fully terminate"), then bring the same
instance back in the same zone: start it when it still exists (termination action STOP, as the seeds' monitor
loop does), create it again otherwise (DELETE, as the seeds' Pub/Sub function does). No state, no other zone, no
guard against a second node, no retry. The Compute calls go through Respawn's own adapter, so the benchmark
compares recovery policy, not client code.

Environment: SEED_WAIT_SECONDS (default 60), SEED_TEMPLATE (a job spec as JSON: the "instance template"; its id
is replaced by the job named in the node's name, so that labels say whose node it is), plus
the Compute endpoint variables functions/clients.py reads.
"""

from __future__ import annotations

import json
import os
import time

import functions_framework

from respawn.control import clients, events, triggers
from respawn.control.adapters.compute import ComputeProvider
from respawn import logs
from respawn.schema import parse_spec


@functions_framework.cloud_event
def restart_preempted_instance(cloud_event) -> None:
    try:
        signal = events.decode(triggers.pubsub_json(cloud_event.data))
    except (triggers.Malformed, events.Undecodable) as exc:
        logs.warning(f"seed restart: event ignored: {exc}")
        return
    time.sleep(float(os.environ.get("SEED_WAIT_SECONDS", "60")))
    template = parse_spec({**json.loads(os.environ["SEED_TEMPLATE"]), "id": signal.job_id})
    provider = ComputeProvider(clients.default())
    if provider.get(signal.zone, signal.node) is not None:
        provider.start(signal.zone, signal.node)
    else:
        provider.create(template, signal.zone, signal.node, signal.attempt or 1, "spot", "")
    logs.info(f"seed restart: {signal.node} is back in {signal.zone}")
