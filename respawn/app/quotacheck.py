"""The CLI's look at a GPU job's regional quotas before `respawn jobs register` writes it (docs/gcp-facts.md §21):
one regions.get per region of the job's zones through respawn.app.compute_read (the user's credentials), judged by
respawn.advice.quota_verdict. A look that cannot be made (no credentials, no permission, no network) says at most
one line; TPU quotas are not in regions.get, so TPU jobs are not looked at.
"""

from __future__ import annotations

from typing import Any

from respawn import advice

from .compute_read import Reader, reader


def region_quotas(look: Reader, regions: list[str]) -> tuple[dict[str, dict[str, advice.Quota] | None], str]:
    """region → metric → Quota (None: not known), and why a region could not be read (the first reason)."""
    out: dict[str, dict[str, advice.Quota] | None] = {}
    problem = ""
    for region in regions:
        answer = look.get(f"projects/{look.project}/regions/{region}")
        if answer.status == 200:
            out[region] = advice.parse_quotas(answer.body)
        else:
            out[region] = None
            problem = problem or (answer.problem if answer.status is None else
                                  f"HTTP {answer.status}" + (f": {answer.message}" if answer.message else ""))
    return out, problem


def check(spec: Any, project: str | None) -> advice.QuotaVerdict | None:
    """The verdict on a job (respawn.schema.JobSpec) from its regions' quotas; None where nothing could be or needs
    to be looked at. A verdict whose regions could not be read carries one line saying so."""
    shape = advice.shape_of(spec.accelerator)
    look = reader(project)
    if shape is None or not isinstance(look, Reader) or not look.project:
        return None
    models = [t.model for t in spec.provisioning_tiers] + (["standard"] if spec.on_demand_nodes else [])
    regions = list(dict.fromkeys(advice.region_of(z) for z in spec.zones))
    quotas, problem = region_quotas(look, regions)
    verdict = advice.quota_verdict(spec.zones, models, shape, spec.slots, quotas, look.project)
    if problem and all(q is None for q in quotas.values()):
        return advice.QuotaVerdict(lines=[f"quotas not checked ({problem})"])
    return verdict
