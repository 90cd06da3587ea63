"""`respawn doctor`: what a deployment (a project, or the local stand-ins) has, then the self-test's probes down every
path it relies on (respawn/app/selftest_run.py). One line per check: ✓, or ✗ and what to do.

The checks read what the caller's credentials may read: the Firestore database the jobs live in, the three topics, and
a subscription (a function's trigger) on each; the Logging sink (its filter, destination and writer identity) and the
scheduler job (enabled, its schedule, topic and message), as the build's `sink` and `scheduler` steps made them. The
probes prove the rest end to end: the sink's writer's role, Eventarc's trigger and its service agents, the functions,
the Slack secret.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from respawn import audit, deployment
from respawn.app import endpoints, selftest_run

REGION = "us-central1"  # the build's default _REGION (cloudbuild.yaml): where the scheduler job is looked for

# Each Pub/Sub-triggered function, by the topic its trigger subscribes to.
TRIGGERED = {fn.trigger: fn for fn in deployment.FUNCTIONS if fn.trigger != "firestore"}


@dataclass(frozen=True)
class Check:
    ok: bool
    line: str


def _mark(ok: bool, text: str) -> Check:
    return Check(ok, f"{'✓' if ok else '✗'} {text}")


def firestore_check(project: str) -> Check:
    from google.cloud import firestore

    try:
        endpoints.check(endpoints.FIRESTORE, project)
        firestore.Client(project=project).collection("jobs").limit(1).get(timeout=endpoints.CALL_DEADLINE_S)
    except endpoints.Unreachable as exc:
        return _mark(False, str(exc))
    except Exception as exc:  # noqa: BLE001 - any refusal is the check's answer, in one line
        return _mark(False, f"Firestore's (default) database cannot be read ({selftest_run.one_line(exc)}): create it "
                            "once with "
                            "gcloud firestore databases create --location=nam5 (docs/deploy.md, step 2)")
    return _mark(True, f"Firestore: the jobs' database answers ({endpoints.where(endpoints.FIRESTORE, project)})")


def topic_checks(project: str) -> list[Check]:
    """Each topic exists and has a subscription: a Pub/Sub-triggered function's trigger (Eventarc's, in a deployment;
    the demo's push subscription locally)."""
    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    checks = []
    try:
        endpoints.check(endpoints.PUBSUB, project)
        publisher = pubsub_v1.PublisherClient()
    except endpoints.Unreachable as exc:
        return [_mark(False, str(exc))]
    except Exception as exc:  # noqa: BLE001 - no credentials: one line
        return [_mark(False, f"Pub/Sub cannot be asked ({selftest_run.one_line(exc)}): gcloud auth "
                             "application-default login")]
    for topic, fn in TRIGGERED.items():
        path = publisher.topic_path(project, topic)
        try:
            publisher.get_topic(topic=path, timeout=endpoints.CALL_DEADLINE_S)
            subscriptions = list(publisher.list_topic_subscriptions(request={"topic": path},
                                                                    timeout=endpoints.CALL_DEADLINE_S))
        except exceptions.NotFound:
            checks.append(_mark(False, f"topic {topic} does not exist: redeploy (cloudbuild.yaml, step topics)"))
            continue
        except Exception as exc:  # noqa: BLE001
            checks.append(_mark(False, f"topic {topic} cannot be read ({selftest_run.one_line(exc)}): the caller needs "
                                       "pubsub.topics.get and pubsub.topics.listSubscriptions"))
            continue
        if subscriptions:
            checks.append(_mark(True, f"topic {topic} feeds {len(subscriptions)} subscription(s) ({fn.entry_point})"))
        else:
            checks.append(_mark(False, f"topic {topic} has no subscription: {fn.name} is not deployed with its "
                                       f"trigger; redeploy (cloudbuild.yaml, step fn-{fn.entry_point.replace('_', '-')})"))
    return checks


def probe_checks(project: str, send: selftest_run.Senders, timeout: float,
                 say: Callable[[str], None]) -> list[Check]:
    answers = selftest_run.run(project, send, timeout=timeout, say=say)
    return [Check(ok, line) for ok, line in selftest_run.results(answers, timeout)]



@dataclass(frozen=True)
class Rest:
    """Cloud Logging's and Cloud Scheduler's REST APIs: Google's with this machine's credentials, or the sim's."""

    session: Any  # a requests.Session (authorized for Google's APIs)
    logging_host: str
    scheduler_host: str


def rest(local: str | None = None) -> Rest:
    """The sim at `local` (by default where respawn.deployment.ENV_COMPUTE_ENDPOINT points), else Google's APIs; raises
    google.auth's DefaultCredentialsError where this machine has no credentials."""
    local = local or os.environ.get(deployment.ENV_COMPUTE_ENDPOINT)
    if local:
        import requests

        return Rest(requests.Session(), local.rstrip("/"), local.rstrip("/"))
    return Rest(selftest_run.google_session(), selftest_run.LOGGING_HOST, selftest_run.SCHEDULER_HOST)


def _read(api: Rest, url: str, what: str, needs: str) -> tuple[dict | None, str]:
    """(the resource, "") or (None, why not in words: "not found", or the refusal and the permission it needs)."""
    try:
        r = api.session.get(url, timeout=endpoints.CALL_DEADLINE_S)
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
        return None, f"{what} cannot be read ({r.status_code} {selftest_run.one_line(Exception(message))}){needed}"
    return r.json(), ""


def sink_check(project: str, api: Rest) -> Check:
    """The Logging sink the build's `sink` step makes: routing respawn.audit.sink_filter() to the log-events topic."""
    sink_name, topic = deployment.SINK, deployment.LOG_EVENTS_TOPIC
    sink, why = _read(api, f"{api.logging_host}/v2/projects/{project}/sinks/{sink_name}",
                      f"Logging sink {sink_name}", "logging.sinks.get")
    if sink is None:
        return _mark(False, f"Logging sink {sink_name} does not exist: no audit event reaches on_log_event; redeploy "
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
        return _mark(False, f"Logging sink {sink_name} " + "; ".join(problems))
    return _mark(True, f"Logging sink {sink_name} routes respawn/audit.py's filter to {topic}; its writer {writer} "
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
            return _mark(False, why)
        elsewhere = "" if region else f" (give --region if the build's _REGION was not {REGION})"
        return _mark(False, f"scheduler job {job_name} does not exist in {where}{elsewhere}: no sweep runs; "
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
        return _mark(False, f"scheduler job {job_name} ({where}) " + "; ".join(problems))
    return _mark(True, f"scheduler job {job_name} ({where}) is enabled: {deployment.SWEEP_SCHEDULE} "
                       f"({job.get('timeZone', 'UTC')}) to {deployment.SWEEP_TOPIC}")


def _message(data: object) -> object:
    try:
        return json.loads(base64.b64decode(str(data)))
    except ValueError:
        return None


def deployment_checks(project: str, region: str | None, local: str | None = None) -> list[Check]:
    """The sink and the scheduler job, each one line; without credentials for Google's APIs, that, for both."""
    local = local or os.environ.get(deployment.ENV_COMPUTE_ENDPOINT)
    emulated = [s.emulator_var for s in (endpoints.FIRESTORE, endpoints.PUBSUB) if os.environ.get(s.emulator_var)]
    if not local and emulated:
        return [_mark(False, f"the Logging sink and the scheduler job of the stand-ins cannot be read: {emulated[0]} "
                             f"is set but not {deployment.ENV_COMPUTE_ENDPOINT}, where the sim serves them (a demo's "
                             "--keep exports both)")]
    try:
        api = rest(local)
    except Exception as exc:  # noqa: BLE001 - no credentials: one line for both checks
        why = (f"the Logging sink and the scheduler job cannot be read: no Google credentials here "
               f"({selftest_run.one_line(exc)}): gcloud auth application-default login")
        return [_mark(False, why)]
    return [sink_check(project, api), scheduler_check(project, region, api)]
