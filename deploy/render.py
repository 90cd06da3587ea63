"""Write what the build's gcloud steps read, from the single definitions in the repository.

    python -m deploy.render --project P --region R --bucket B --slack-secret S --build-id ID --wheel-dir D --out O
                            [--network N] [--subnetwork S] [--node-identities K]

D/respawn-agent-V.pyz  the agent zipapp (deploy/agent_zipapp.py), built beside the wheel that `pip wheel` put in D
O/names.env            shell variables: resource names (respawn/deployment.py), service account emails, the two
                       release files and where they go (WHEEL → WHEEL_URI, AGENT → AGENT_URI)
O/sink-filter.txt      respawn.audit.sink_filter(P): the Logging sink's filter
O/function-env.yaml    the functions' environment (--env-vars-file)
O/roles/ROLE.yaml      each custom role of deploy/iam/permissions.yaml (--file of gcloud iam roles create|update)
O/conditions/NAME.yaml each IAM condition a binding carries (--condition-from-file)
O/bindings.tsv         kind, resource, member, role, condition file (or None): every IAM binding the build adds
                       before deploying
O/indexes.json         the composite indexes of deploy/firestore/indexes.yaml
O/function-source/     the uploaded function source (deploy/stage.py)
Every failure names the input to fix.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import yaml

from deploy import agent_zipapp, iam, stage
from respawn import audit, deployment, selftest

ROOT = Path(__file__).resolve().parent.parent
INDEXES_FILE = ROOT / "deploy" / "firestore" / "indexes.yaml"
# How long a Compute or TPU operation may be waited on inside one invocation: below the functions' 540 s timeout,
# so a slow create ends in a retried delivery rather than a killed instance.
OP_TIMEOUT_SECONDS = 480

_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_NETWORK = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class RenderError(ValueError):
    pass


def _check(value: str, pattern: re.Pattern, what: str, hint: str) -> str:
    if not value or not pattern.match(value):
        raise RenderError(f"{what} {value!r} is not valid: {hint}")
    return value


def emails(project: str) -> dict[str, str]:
    """The email of each of Respawn's own service accounts (the node pool's: node_emails)."""
    return {key: deployment.service_account_email(account, project) for key, account in
            (("controller", deployment.CONTROLLER_SA), ("notifier", deployment.NOTIFIER_SA),
             ("trigger", deployment.TRIGGER_SA))}


def node_emails(project: str, identities: int) -> list[str]:
    return [deployment.service_account_email(a, project) for a in deployment.node_identities(identities)]


def names(project: str, region: str, bucket: str, slack_secret: str, wheel: Path, wheel_uri: str, agent: Path,
          agent_uri: str, network: str = deployment.DEFAULT_NETWORK,
          identities: int = deployment.DEFAULT_NODE_IDENTITIES) -> dict[str, str]:
    sa = emails(project)
    return {
        "PROJECT": project, "REGION": region, "BUCKET": bucket, "SLACK_SECRET": slack_secret,
        "NETWORK": network,

        "LOG_EVENTS_TOPIC": deployment.LOG_EVENTS_TOPIC, "ALERTS_TOPIC": deployment.ALERTS_TOPIC,
        "SWEEP_TOPIC": deployment.SWEEP_TOPIC, "SINK": deployment.SINK,
        "SCHEDULER_JOB": deployment.SCHEDULER_JOB, "SWEEP_SCHEDULE": deployment.SWEEP_SCHEDULE,
        "SWEEP_MESSAGE": deployment.SWEEP_MESSAGE,
        "CONTROLLER_SA": deployment.CONTROLLER_SA, "NOTIFIER_SA": deployment.NOTIFIER_SA,
        "TRIGGER_SA": deployment.TRIGGER_SA,
        "CONTROLLER_EMAIL": sa["controller"], "NOTIFIER_EMAIL": sa["notifier"], "TRIGGER_EMAIL": sa["trigger"],
        # The node pool: identity i is NODE_SAS' i-th word, its ingress rule NODE_FIREWALL_RULES' i-th word, its
        # heartbeats' database NODE_DATABASES' i-th word.
        "NODE_SAS": " ".join(deployment.node_identities(identities)),
        "NODE_EMAILS": " ".join(node_emails(project, identities)),
        "NODE_FIREWALL_RULES": " ".join(deployment.node_firewall_rule(i) for i in range(1, identities + 1)),
        "NODE_DATABASES": " ".join(deployment.heartbeat_database(e) for e in node_emails(project, identities)),
        "SELFTEST_DATABASE": selftest.DATABASE,
        "TTL_COLLECTION_GROUP": deployment.TTL_COLLECTION_GROUP, "TTL_FIELD": deployment.TTL_FIELD,
        "JOB_DOCUMENT_PATTERN": deployment.JOB_DOCUMENT_PATTERN, "JOB_CREATED_EVENT": deployment.JOB_CREATED_EVENT,
        "WHEEL": str(wheel), "WHEEL_URI": wheel_uri, "AGENT": str(agent), "AGENT_URI": agent_uri,
        "ROLES": " ".join(r.id for r in iam.roles()),
        "APIS": " ".join(deployment.APIS), "PUBSUB_AGENT_ROLE": deployment.PUBSUB_AGENT_ROLE,
    }


def function_env(project: str, region: str, node_emails: list[str], agent: str, library: str, build_id: str,
                 network: str = deployment.DEFAULT_NETWORK, subnetwork: str = "") -> dict[str, str]:
    nodes_network = {}
    if network != deployment.DEFAULT_NETWORK:
        nodes_network[deployment.ENV_NETWORK] = f"projects/{project}/global/networks/{network}"
    if subnetwork:
        nodes_network[deployment.ENV_SUBNETWORK] = f"projects/{project}/regions/{region}/subnetworks/{subnetwork}"
    return {
        **nodes_network,
        deployment.ENV_PROJECT: project,
        deployment.ENV_REGION: region,
        deployment.ENV_ALERTS_TOPIC: deployment.ALERTS_TOPIC,
        deployment.ENV_SWEEP_TOPIC: deployment.SWEEP_TOPIC,
        deployment.ENV_NODE_IDENTITIES: ",".join(node_emails),
        deployment.ENV_AGENT: agent,
        deployment.ENV_LIBRARY: library,
        deployment.ENV_VERSION: build_id,
        "RESPAWN_OP_TIMEOUT_SECONDS": str(OP_TIMEOUT_SECONDS),
    }


def bindings(project: str, bucket: str, slack_secret: str,
             identities: int = deployment.DEFAULT_NODE_IDENTITIES) -> list[tuple[str, str, str, str, str]]:
    """(kind, resource, member, role, condition: "NAME" or "NAME@IDENTITY" (a key of iam.CONDITIONS, made for that
    node identity) or "None") for every binding made before the functions exist. A node role is bound for each identity of the pool; the controller's act-as on each identity's
    account; a job-folder role by the controller at run time, not here."""
    sa = emails(project)
    nodes = node_emails(project, identities)
    resource = {"project": ("project", project),
                "alerts-topic": ("topic", deployment.ALERTS_TOPIC),
                "sweep-topic": ("topic", deployment.SWEEP_TOPIC),
                "checkpoint-bucket": ("bucket", f"gs://{bucket}"),
                "slack-secret": ("secret", slack_secret)}
    out = []
    for r in iam.roles():
        role, condition = f"projects/{project}/roles/{r.id}", r.condition or "None"
        if r.scope == "job-folder":
            continue
        if r.scope == "node-service-account":
            out += [("service-account", node, f"serviceAccount:{sa[r.member]}", role, condition) for node in nodes]
        elif r.member == "node":
            out += [(*resource[r.scope], f"serviceAccount:{node}", role,
                     condition if r.condition is None else f"{r.condition}@{node}") for node in nodes]
        else:
            out.append((*resource[r.scope], f"serviceAccount:{sa[r.member]}", role, condition))
    for p in iam.load()["predefined"]:
        # each-function and log-events-topic are bound in their own build steps, the Pub/Sub agent in bindings'
        if p["scope"] in resource and p["member"] in sa:
            out.append((*resource[p["scope"]], f"serviceAccount:{sa[p['member']]}", p["role"], "None"))
    return out


def project_bindings(project: str, identities: int = deployment.DEFAULT_NODE_IDENTITIES
                     ) -> list[tuple[str, str, dict | None]]:
    """(member, role, the condition's body or None) of every role bindings() binds on the project: what `respawn
    doctor` looks for in the project's IAM policy and what the sim's record of the build holds. The Pub/Sub service
    agent's grant, named by the project's number, is the `bindings` step's own (respawn.deployment.PUBSUB_AGENT_ROLE).
    No project binding depends on the bucket or the secret, so none is asked for."""
    out = []
    for kind, _, member, role, condition in bindings(project, "", "", identities):
        if kind != "project":
            continue
        made = None
        if condition != "None":
            name, _, identity = condition.partition("@")
            made = iam.CONDITIONS[name](project, "", identity or None).definition()
        out.append((member, role, made))
    return out


def indexes(path: Path = INDEXES_FILE) -> list[dict]:
    data = yaml.safe_load(path.read_text()) or {}
    out = []
    for ix in data.get("indexes") or []:
        fields = [f"field-path={f['field']},order={f.get('order', 'ascending')}" for f in ix["fields"]]
        out.append({"collection_group": ix["collection_group"], "field_config": fields})
    return out


def render(project: str, region: str, bucket: str, slack_secret: str, build_id: str, wheel_dir: Path,
           out: Path, network: str = deployment.DEFAULT_NETWORK, subnetwork: str = "",
           identities: int = deployment.DEFAULT_NODE_IDENTITIES) -> Path:
    _check(project, _PROJECT, "project", "set the _PROJECT substitution to a project ID")
    _check(region, _REGION, "region", "set _REGION to a Cloud Functions region such as us-central1")
    _check(bucket, _BUCKET, "checkpoint bucket",
           "pass --substitutions=_CHECKPOINT_BUCKET=NAME (the bucket name, without gs://)")
    _check(slack_secret, _SECRET, "Slack secret", "set _SLACK_SECRET to the Secret Manager secret's name")
    _check(network, _NETWORK, "network", "set _NETWORK to the nodes' VPC network name (default: default)")
    if subnetwork:
        _check(subnetwork, _NETWORK, "subnetwork", "set _SUBNETWORK to a subnetwork name in _REGION, or leave it empty")
    if not 1 <= identities <= deployment.MAX_NODE_IDENTITIES:
        raise RenderError(f"node identities {identities} is not within 1..{deployment.MAX_NODE_IDENTITIES}: set "
                          "_NODE_IDENTITIES to how many jobs may run at once")
    if not build_id:
        raise RenderError("build id is empty: Cloud Build sets $BUILD_ID")
    wheels = sorted(Path(wheel_dir).glob("respawn-*.whl"))
    if len(wheels) != 1:
        raise RenderError(f"expected one respawn wheel in {wheel_dir}, found {[w.name for w in wheels]}: "
                          "the build step runs `pip wheel` into an empty folder first")
    wheel = wheels[0]
    try:
        agent = agent_zipapp.build(Path(wheel_dir), ROOT)
    except agent_zipapp.ZipappError as exc:
        raise RenderError(str(exc)) from None
    out = Path(out)
    (out / "roles").mkdir(parents=True, exist_ok=True)
    # Each release file goes to the build's own folder, and the nodes get its URI with its digest.
    artifacts = {path: deployment.release_artifact(bucket, build_id, path.name, agent_zipapp.sha256(path))
                 for path in (wheel, agent)}
    uri = {path: artifact.split("#", 1)[0] for path, artifact in artifacts.items()}
    env_names = names(project, region, bucket, slack_secret, wheel, uri[wheel], agent, uri[agent], network, identities)
    (out / "names.env").write_text(
        "# Generated by deploy/render.py\n" + "".join(f"{k}={shlex.quote(v)}\n" for k, v in env_names.items()))
    (out / "sink-filter.txt").write_text(audit.sink_filter(project))
    env = function_env(project, region, node_emails(project, identities), artifacts[agent], artifacts[wheel],
                       build_id, network, subnetwork)
    (out / "function-env.yaml").write_text(yaml.safe_dump(env, default_flow_style=False, sort_keys=True))
    for role in iam.roles():
        (out / "roles" / f"{role.id}.yaml").write_text(yaml.safe_dump(role.definition(), sort_keys=False))
    (out / "conditions").mkdir(exist_ok=True)
    rows = []
    for *binding, condition in bindings(project, bucket, slack_secret, identities):
        if condition != "None":
            name, _, identity = condition.partition("@")
            made = iam.CONDITIONS[name](project, bucket, identity or None)
            condition = f"conditions/{name}-{identity.split('@')[0]}.yaml" if identity else f"conditions/{name}.yaml"
            (out / condition).write_text(yaml.safe_dump(made.definition(), sort_keys=False))  # under BUILD_DIR
        rows.append("\t".join((*binding, condition)) + "\n")
    (out / "bindings.tsv").write_text("".join(rows))
    (out / "indexes.json").write_text(json.dumps(indexes(), indent=1))
    stage.stage(ROOT, out / "function-source")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.render", description=__doc__.split("\n")[0])
    for flag in ("project", "region", "bucket", "slack-secret", "build-id", "wheel-dir", "out"):
        ap.add_argument(f"--{flag}", required=True)
    ap.add_argument("--network", default=deployment.DEFAULT_NETWORK)
    ap.add_argument("--subnetwork", default="")
    ap.add_argument("--node-identities", type=int, default=deployment.DEFAULT_NODE_IDENTITIES)
    a = ap.parse_args(argv)
    try:
        render(a.project, a.region, a.bucket, a.slack_secret, a.build_id, Path(a.wheel_dir), Path(a.out), a.network,
               a.subnetwork, a.node_identities)
    except (RenderError, stage.StageError) as exc:
        print(f"deploy.render: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
