"""The CLI's look, before it registers a multi-node job, for the ingress rule that lets the job's members reach each
other (respawn.deployment.NODE_FIREWALL_RULE, created by the build): one firewalls.get through
respawn.compute_read. Only what it can see is said: a rule that is missing or disabled. A look that cannot be made
(no credentials, no permission, no network) says nothing; the rule may well be there.
"""

from __future__ import annotations

from respawn.compute_read import Reader, reader
from respawn.deployment import NODE_FIREWALL_RULE, NODE_SA, service_account_email


def missing_rule(project: str | None) -> str | None:
    """Why the job's members may not reach each other, or None when the rule is there or cannot be looked at."""
    look = reader(project)
    if not isinstance(look, Reader) or not look.project:
        return None
    answer = look.get(f"projects/{look.project}/global/firewalls/{NODE_FIREWALL_RULE}")
    node = service_account_email(NODE_SA, look.project)
    create = (f"gcloud compute firewall-rules create {NODE_FIREWALL_RULE} --network=NETWORK --direction=INGRESS "
              f"--action=ALLOW --rules=all --source-service-accounts={node} --target-service-accounts={node}")
    if answer.status == 404:
        return (f"firewall rule {NODE_FIREWALL_RULE} not found in project {look.project}: on any network but an "
                "unchanged `default` the job's nodes cannot reach each other (torchrun, NCCL and the JAX coordinator "
                f"hang in rendezvous). Run the build again (docs/deploy.md), or: {create}")
    if answer.status == 200 and answer.body.get("disabled"):
        return (f"firewall rule {NODE_FIREWALL_RULE} in project {look.project} is disabled: the job's nodes may not "
                f"reach each other. Enable it: gcloud compute firewall-rules update {NODE_FIREWALL_RULE} --no-disabled")
    return None
