"""What the build made in the project, each one line for `respawn doctor` (respawn/app/doctor.py): the APIs it enables
(respawn.deployment.APIS), the service accounts it makes (the controller's, the notifier's, the trigger's and the
node pool's), the roles it binds on the project (deploy/render.py's project_bindings, from
deploy/iam/permissions.yaml) and the Pub/Sub service agent's grant, the Slack secret's latest version, the composite
indexes of deploy/firestore/indexes.yaml in the jobs' database (READY), the Logging sink (its filter, destination and
writer identity) and the scheduler job (enabled, its schedule, topic and message), as the build's steps made them.
Read over REST with the caller's credentials, or from the sim's record of a deployment to the stand-ins.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from respawn import audit, deployment
from respawn.logs import one_line

from . import endpoints, selftest_run
from .doctor import Check, mark

SERVICE_USAGE_HOST = "https://serviceusage.googleapis.com"
IAM_HOST = "https://iam.googleapis.com"
RESOURCE_MANAGER_HOST = "https://cloudresourcemanager.googleapis.com"
SECRET_MANAGER_HOST = "https://secretmanager.googleapis.com"
FIRESTORE_ADMIN_HOST = "https://firestore.googleapis.com"
JOBS_DATABASE = "(default)"  # the jobs' Firestore database, where the build's `firestore` step creates the indexes
REGION = "us-central1"  # the build's default _REGION (cloudbuild.yaml): where the scheduler job is looked for


@dataclass(frozen=True)
class Rest:
    """The REST APIs the checks read (Cloud Logging, Cloud Scheduler, Service Usage, IAM, Resource Manager, Secret
    Manager, the Firestore Admin API): Google's with this machine's credentials, or the sim's."""

    session: Any  # a requests.Session (authorized for Google's APIs)
    logging_host: str
    scheduler_host: str
    service_usage_host: str = SERVICE_USAGE_HOST
    iam_host: str = IAM_HOST
    resource_manager_host: str = RESOURCE_MANAGER_HOST
    secret_manager_host: str = SECRET_MANAGER_HOST
    firestore_admin_host: str = FIRESTORE_ADMIN_HOST


def rest(local: str | None = None) -> Rest:
    """The sim at `local` (by default where respawn.deployment.ENV_COMPUTE_ENDPOINT points), else Google's APIs; raises
    google.auth's DefaultCredentialsError where this machine has no credentials."""
    local = local or os.environ.get(deployment.ENV_COMPUTE_ENDPOINT)
    if local:
        import requests

        base = local.rstrip("/")
        return Rest(requests.Session(), base, base, base, base, base, base, base)
    return Rest(selftest_run.google_session(), selftest_run.LOGGING_HOST, selftest_run.SCHEDULER_HOST)


def _read(api: Rest, url: str, what: str, needs: str, body: dict | None = None,
          params: dict | None = None) -> tuple[dict | None, str]:
    """(the resource, "") or (None, why not in words: "not found", or the refusal and the permission it needs); a
    POST of `body` where one is given (Resource Manager's getIamPolicy)."""
    try:
        if body is None:
            r = api.session.get(url, params=params, timeout=endpoints.CALL_DEADLINE_S)
        else:
            r = api.session.post(url, json=body, params=params, timeout=endpoints.CALL_DEADLINE_S)
    except Exception as exc:  # noqa: BLE001 - an endpoint that does not answer is the check's answer, in one line
        base = "/".join(url.split("/")[:3])
        return None, (f"{what} cannot be read: {base} does not answer ({type(exc).__name__}); check this machine's "
                      f"network, or, in local runs, that the sim still serves where {deployment.ENV_COMPUTE_ENDPOINT} "
                      "points")
    if r.status_code == 404:
        return None, "not found"
    if not r.ok:
        try:
            message = r.json()["error"]["message"]
        except Exception:  # noqa: BLE001 - a body that is not Google's error: its text
            message = r.text
        needed = f": the caller needs {needs}" if r.status_code in (401, 403) else ""
        return None, f"{what} cannot be read ({r.status_code} {one_line(message, 200)}){needed}"
    return r.json(), ""


def sink_check(project: str, api: Rest) -> Check:
    """The Logging sink the build's `sink` step makes: routing respawn.audit.sink_filter() to the log-events topic."""
    sink_name, topic = deployment.SINK, deployment.LOG_EVENTS_TOPIC
    sink, why = _read(api, f"{api.logging_host}/v2/projects/{project}/sinks/{sink_name}",
                      f"Logging sink {sink_name}", "logging.sinks.get")
    if sink is None:
        return mark(False, f"Logging sink {sink_name} does not exist: no audit event reaches on_log_event; redeploy "
                            "(cloudbuild.yaml, step sink)" if why == "not found" else why)
    problems = []
    if sink.get("disabled"):
        problems.append(f"is disabled: gcloud logging sinks update {sink_name} --no-disabled")
    destination = f"pubsub.googleapis.com/projects/{project}/topics/{topic}"
    if sink.get("destination") != destination:
        problems.append(f"routes to {sink.get('destination') or 'nowhere'}, not {topic}: redeploy (cloudbuild.yaml, "
                        "step sink)")
    if " ".join(str(sink.get("filter", "")).split()) != " ".join(audit.sink_filter(project).split()):
        problems.append("has another filter than respawn/audit.py builds (preemptions and the self-test's probe "
                        "may not be routed): redeploy (cloudbuild.yaml, step sink)")
    writer = sink.get("writerIdentity")
    if not writer:
        problems.append(f"has no writer identity, so nothing can publish to {topic}: delete it and redeploy "
                        "(cloudbuild.yaml, step sink)")
    if problems:
        return mark(False, f"Logging sink {sink_name} " + "; ".join(problems))
    return mark(True, f"Logging sink {sink_name} routes respawn/audit.py's filter to {topic}; its writer {writer} "
                       f"needs roles/pubsub.publisher there (if on_log_event does not answer: gcloud pubsub topics "
                       f"add-iam-policy-binding {topic} --member={writer} --role=roles/pubsub.publisher)")


def scheduler_check(project: str, region: str | None, api: Rest) -> Check:
    """The scheduler job the build's `scheduler` step makes: enabled, on SWEEP_SCHEDULE, publishing SWEEP_MESSAGE to
    the sweep topic."""
    job_name, where = deployment.SCHEDULER_JOB, region or REGION
    job, why = _read(api, f"{api.scheduler_host}/v1/projects/{project}/locations/{where}/jobs/{job_name}",
                     f"scheduler job {job_name} ({where})", "cloudscheduler.jobs.get")
    if job is None:
        if why != "not found":
            return mark(False, why)
        elsewhere = "" if region else f" (give --region if the build's _REGION was not {REGION})"
        return mark(False, f"scheduler job {job_name} does not exist in {where}{elsewhere}: no sweep runs; "
                            "redeploy (cloudbuild.yaml, step scheduler)")
    problems = []
    state = job.get("state") or "in no state"
    if state == "PAUSED":
        problems.append(f"is PAUSED: gcloud scheduler jobs resume {job_name} --location={where}")
    elif state == "UPDATE_FAILED":
        problems.append("is UPDATE_FAILED (its last update failed): redeploy (cloudbuild.yaml, step scheduler)")
    elif state != "ENABLED":
        problems.append(f"is {state}, not ENABLED (Cloud Scheduler disables a job after an error): gcloud scheduler "
                        f"jobs describe {job_name} --location={where} says why")
    target = job.get("pubsubTarget") or {}
    topic = f"projects/{project}/topics/{deployment.SWEEP_TOPIC}"
    if target.get("topicName") != topic:
        problems.append(f"publishes to {target.get('topicName') or 'no topic'}, not {deployment.SWEEP_TOPIC}: "
                        "redeploy (cloudbuild.yaml, step scheduler)")
    if job.get("schedule") != deployment.SWEEP_SCHEDULE:
        problems.append(f"runs on {job.get('schedule')!r}, not {deployment.SWEEP_SCHEDULE!r}: redeploy "
                        "(cloudbuild.yaml, step scheduler)")
    if _message(target.get("data")) != json.loads(deployment.SWEEP_MESSAGE):
        problems.append(f"publishes another message than {deployment.SWEEP_MESSAGE}: redeploy (cloudbuild.yaml, "
                        "step scheduler)")
    if problems:
        return mark(False, f"scheduler job {job_name} ({where}) " + "; ".join(problems))
    return mark(True, f"scheduler job {job_name} ({where}) is enabled: {deployment.SWEEP_SCHEDULE} "
                       f"({job.get('timeZone', 'UTC')}) to {deployment.SWEEP_TOPIC}")


def _message(data: object) -> object:
    try:
        return json.loads(base64.b64decode(str(data)))
    except ValueError:
        return None


def _some(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def apis_check(project: str, api: Rest) -> Check:
    """Every API the build's `apis` step enables (respawn.deployment.APIS) is enabled."""
    enabled: set[str] = set()
    params = {"filter": "state:ENABLED", "pageSize": 200}
    while True:
        page, why = _read(api, f"{api.service_usage_host}/v1/projects/{project}/services", "the enabled APIs",
                          "serviceusage.services.list", params=params)
        if page is None:
            return mark(False, f"the APIs of project {project} cannot be listed: Service Usage answers not found"
                         if why == "not found" else why)
        enabled |= {str(s.get("config", {}).get("name") or s.get("name", "").rsplit("/", 1)[-1])
                    for s in page.get("services", []) if s.get("state") == "ENABLED"}
        if not page.get("nextPageToken"):
            break
        params = {**params, "pageToken": page["nextPageToken"]}
    missing = [a for a in deployment.APIS if a not in enabled]
    if missing:
        return mark(False, f"APIs not enabled: {', '.join(missing)}: gcloud services enable {' '.join(missing)} "
                            f"--project={project} (cloudbuild.yaml, step apis)")
    return mark(True, f"the {len(deployment.APIS)} APIs the deployment uses are enabled")


def service_account_check(project: str, identities: int, api: Rest) -> Check:
    """The service accounts the build's `service-accounts` step makes exist and are enabled."""
    missing, disabled = [], []
    for account in deployment.service_accounts(identities):
        email = deployment.service_account_email(account, project)
        found, why = _read(api, f"{api.iam_host}/v1/projects/{project}/serviceAccounts/{email}",
                           f"service account {email}", "iam.serviceAccounts.get")
        if found is None and why != "not found":
            return mark(False, why)
        if found is None:
            missing.append(account)
        elif found.get("disabled"):
            disabled.append(email)
    problems = []
    if missing:
        problems.append(f"missing: {_some(missing)}: redeploy (cloudbuild.yaml, steps service-accounts and "
                        "bindings: an account made again is a new principal, bound to nothing)")
    if disabled:
        problems.append(f"disabled: {_some(disabled)}: gcloud iam service-accounts enable EMAIL")
    if problems:
        return mark(False, "service accounts: " + "; ".join(problems))
    return mark(True, f"service accounts: {deployment.CONTROLLER_SA}, {deployment.NOTIFIER_SA}, "
                       f"{deployment.TRIGGER_SA} and the {identities} node identities exist")


def _bound(policy: dict, member: str, role: str, condition: dict | None) -> bool:
    def same(found: dict | None) -> bool:
        if condition is None or found is None:
            return condition is None and found is None
        return " ".join(str(found.get("expression", "")).split()) == " ".join(condition["expression"].split())

    return any(b.get("role") == role and member in b.get("members", []) and same(b.get("condition"))
               for b in policy.get("bindings", []))


def _render() -> Any:
    """deploy/render.py, whose project_bindings() says which roles the build binds on the project: importable where
    PYTHONPATH names the checkout's deploy/ (the build's last step), or found beside this respawn when it runs from a
    checkout (an editable install, as `respawn demo` finds sim/); None where neither."""
    try:
        from deploy import render
    except ImportError:
        checkout = deployment.source_root()
        if not (checkout / "deploy" / "render.py").is_file():
            return None
        sys.path.append(str(checkout))  # after the installed packages: it adds deploy, and shadows nothing imported
        try:
            from deploy import render
        except ImportError:
            return None
    return render


def binding_checks(project: str, identities: int, api: Rest) -> list[Check]:
    """The roles the build's `bindings` step binds on the project (deploy/render.py's project_bindings, from
    deploy/iam/permissions.yaml), and the Pub/Sub service agent's roles/iam.serviceAccountTokenCreator."""
    base = f"{api.resource_manager_host}/v1/projects/{project}"
    found, why = _read(api, base, f"project {project}", "resourcemanager.projects.get")
    policy, why_policy = _read(api, f"{base}:getIamPolicy", f"the IAM policy of project {project}",
                               "resourcemanager.projects.getIamPolicy", body={"options": {"requestedPolicyVersion": 3}})
    if found is None or policy is None:
        return [mark(False, (why if found is None else why_policy).replace("not found", f"project {project} not "
                                                                                         "found"))]
    checks = []
    render = _render()
    if render is None:
        checks.append(mark(False, "the roles bound on the project were not checked: they are read from "
                                   "deploy/iam/permissions.yaml, which a Respawn checkout has and an installed "
                                   "respawn does not: run respawn doctor from a checkout's editable install, or "
                                   "with PYTHONPATH naming a folder that holds the checkout's deploy/"))
    else:
        wanted = render.project_bindings(project, identities)
        missing = [f"{role.rsplit('/', 1)[-1]} to {member.split(':', 1)[-1]}"
                   + (f" (condition {condition['title']!r})" if condition else "")
                   for member, role, condition in wanted if not _bound(policy, member, role, condition)]
        if missing:
            checks.append(mark(False, f"roles not bound on the project: {_some(missing, 3)}: redeploy "
                                       "(cloudbuild.yaml, step bindings)"))
        else:
            checks.append(mark(True, f"the {len(wanted)} role bindings the deployment makes on the project are there"))
    agent = f"serviceAccount:{deployment.pubsub_service_agent(str(found.get('projectNumber')))}"
    role = deployment.PUBSUB_AGENT_ROLE
    if _bound(policy, agent, role, None):
        checks.append(mark(True, f"the Pub/Sub service agent holds {role} (Eventarc's Pub/Sub triggers)"))
    else:
        checks.append(mark(False, f"the Pub/Sub service agent lacks {role}: in a project that enabled Pub/Sub on or "
                                   "before 2021-04-08, on_log_event, on_sweep and on_alert get no events: gcloud "
                                   f"projects add-iam-policy-binding {project} --member={agent} --role={role} "
                                   "--condition=None"))
    return checks


def secret_check(project: str, secret: str, api: Rest) -> Check:
    """The Slack secret on_alert reads (`--set-secrets SLACK_WEBHOOK_URL=SECRET:latest`) has an enabled latest
    version."""
    add = (f"printf %s \"$WEBHOOK_URL\" | gcloud secrets versions add {secret} --data-file=- (docs/deploy.md, step "
           "3), then redeploy")
    version, why = _read(api, f"{api.secret_manager_host}/v1/projects/{project}/secrets/{secret}/versions/latest",
                         f"Slack secret {secret}", "secretmanager.versions.get")
    if version is None:
        return mark(False, f"Slack secret {secret} does not exist or has no version: on_alert cannot start; {add}"
                     if why == "not found" else why)
    number, state = str(version.get("name", "")).rsplit("/", 1)[-1], version.get("state")
    if state != "ENABLED":
        return mark(False, f"Slack secret {secret}: its latest version ({number}) is {state}: an on_alert instance "
                            f"that starts cannot read it; gcloud secrets versions enable {number} --secret={secret}, "
                            f"or {add}")
    return mark(True, f"Slack secret {secret}: its latest version ({number}) is enabled (what Slack makes of its URL, "
                       "the alert's probe shows)")


def _index_text(ix: dict) -> str:
    fields = [c.split(",") for c in ix["field_config"]]  # field-path=F,order=O (deploy/render.py's indexes())
    return f"{ix['collection_group']} (" + ", ".join(
        " ".join(p.split("=", 1)[1] for p in parts) for parts in fields) + ")"


def index_check(project: str, api: Rest, indexes: Path | None = None) -> Check:
    """The composite indexes the build's `firestore` step creates in the jobs' database (deploy/firestore/indexes.yaml,
    or `indexes`, through deploy/render.py's indexes()) are there and READY (Firestore Admin v1 indexes.list:
    docs/gcp-facts.md §32)."""
    render = _render()
    source = str(indexes) if indexes else "deploy/firestore/indexes.yaml"
    if render is None:
        return mark(False, f"the Firestore composite indexes were not checked: they are read from {source}, which a "
                            "Respawn checkout has and an installed respawn does not: run respawn doctor from a "
                            "checkout's editable install, or with PYTHONPATH naming a folder that holds the checkout's "
                            "deploy/")
    from deploy import firestore_indexes  # beside render: the build's own diff of wanted and listed indexes

    wanted = render.indexes(indexes) if indexes else render.indexes()
    listed: list[dict] = []
    url = f"{api.firestore_admin_host}/v1/projects/{project}/databases/{JOBS_DATABASE}/collectionGroups/-/indexes"
    params: dict = {"pageSize": 100}
    while True:
        page, why = _read(api, url, f"the composite indexes of Firestore database {JOBS_DATABASE}",
                          "datastore.indexes.list", params=params)
        if page is None:
            return mark(False, f"the composite indexes of Firestore database {JOBS_DATABASE} cannot be listed: the "
                                "database was not found (docs/deploy.md, step 2)" if why == "not found" else why)
        listed += page.get("indexes", [])
        if not page.get("nextPageToken"):
            break
        params = {**params, "pageToken": page["nextPageToken"]}
    states: dict[tuple, list[tuple[str, str]]] = {}
    for ix in listed:
        states.setdefault(firestore_indexes.listed_key(ix), []).append(
            (str(ix.get("state") or "STATE_UNSPECIFIED"), str(ix.get("name", "")).rsplit("/", 1)[-1]))
    where = f"--database='{JOBS_DATABASE}' --project={project}"
    problems = []
    for ix in wanted:
        found = states.get(firestore_indexes.wanted_key(ix), [])
        have = {state for state, _ in found}
        create = f"gcloud firestore indexes composite create {where} {' '.join(firestore_indexes.create_args(ix))}"
        if "READY" in have:
            continue
        if "CREATING" in have:
            problems.append(f"{_index_text(ix)} is still building (CREATING; a query that needs it fails until it "
                            "is READY): wait, and run respawn doctor again")
        elif found:
            state, index_id = found[0]
            problems.append(f"{_index_text(ix)} is {state}: gcloud firestore indexes composite delete {index_id} "
                            f"{where}, then {create}")
        else:
            problems.append(f"{_index_text(ix)} is missing: {create} (or redeploy: cloudbuild.yaml, step firestore)")
    if problems:
        return mark(False, f"Firestore composite indexes of {JOBS_DATABASE} ({source}): " + "; ".join(problems))
    if not wanted:
        return mark(True, f"Firestore composite indexes: {source} wants none ({len(listed)} in {JOBS_DATABASE})")
    return mark(True, f"Firestore composite indexes: all {len(wanted)} of {source} are READY in {JOBS_DATABASE}")


def deployment_checks(project: str, region: str | None, local: str | None = None,
                      identities: int = deployment.DEFAULT_NODE_IDENTITIES,
                      slack_secret: str = deployment.DEFAULT_SLACK_SECRET,
                      indexes: Path | None = None) -> list[Check]:
    """The APIs, the service accounts, the project's role bindings and the Pub/Sub service agent's, the Slack secret,
    the Firestore composite indexes (those of `indexes`, deploy/firestore/indexes.yaml by default), the sink and the
    scheduler job, each one line; without credentials for Google's APIs, that, for all."""
    local = local or os.environ.get(deployment.ENV_COMPUTE_ENDPOINT)
    emulated = [s.emulator_var for s in (endpoints.FIRESTORE, endpoints.PUBSUB) if os.environ.get(s.emulator_var)]
    if not local and emulated:
        return [mark(False, f"what the build made in the stand-ins' project cannot be read: {emulated[0]} "
                             f"is set but not {deployment.ENV_COMPUTE_ENDPOINT}, where the sim serves them (a demo's "
                             "--keep exports both)")]
    try:
        api = rest(local)
    except Exception as exc:  # noqa: BLE001 - no credentials: one line for both checks
        why = (f"what the build made in the project cannot be read: no Google credentials here "
               f"({one_line(exc, 200)}): gcloud auth application-default login")
        return [mark(False, why)]
    return [apis_check(project, api), service_account_check(project, identities, api),
            *binding_checks(project, identities, api), secret_check(project, slack_secret, api),
            index_check(project, api, indexes), sink_check(project, api), scheduler_check(project, region, api)]
