"""The CLI's look, before it registers a multi-node job, for the ingress rules that let a job's members reach each
other (respawn.deployment.node_firewall_rule, one per node identity, created by the build): one firewalls.get of
the first identity's rule (the build makes them all or none) through respawn.app.compute_read. Only what it can see is said: a rule that is missing or disabled. A look that cannot be made
(no credentials, no permission, no network) says nothing; the rule may well be there.
"""

from __future__ import annotations

from respawn.deployment import node_firewall_rule, node_identity, service_account_email

from .compute_read import Reader, reader


def missing_rule(project: str | None) -> str | None:
    """Why the job's members may not reach each other, or None when the rule is there or cannot be looked at."""
    look = reader(project)
    if not isinstance(look, Reader) or not look.project:
        return None
    rule = node_firewall_rule(1)
    answer = look.get(f"projects/{look.project}/global/firewalls/{rule}")
    node = service_account_email(node_identity(1), look.project)
    create = (f"gcloud compute firewall-rules create {rule} --network=NETWORK --direction=INGRESS --action=ALLOW "
              f"--rules=all --source-service-accounts={node} --target-service-accounts={node} (and so on for each "
              "node identity)")
    if answer.status == 404:
        return (f"firewall rule {rule} not found in project {look.project}: on any network but an unchanged "
                "`default` the job's nodes cannot reach each other (torchrun, NCCL and the JAX coordinator hang in "
                f"rendezvous). Run the build again (docs/deploy.md), which makes one per node identity, or: {create}")
    if answer.status == 200 and answer.body.get("disabled"):
        return (f"firewall rule {rule} in project {look.project} is disabled: the nodes of a job may not reach each "
                f"other. Enable it: gcloud compute firewall-rules update {rule} --no-disabled")
    return None
