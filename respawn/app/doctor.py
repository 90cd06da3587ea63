"""`respawn doctor`: what a deployment (a project, or the local stand-ins) has, then the self-test's probes down every
path it relies on (respawn/app/selftest_run.py). One line per check: ✓, or ✗ and what to do.

Here: the Firestore database the jobs live in, the three topics with a subscription (a function's trigger) on each,
and the probes. What the build made in the project is read by respawn/app/project_checks.py. The probes prove the
rest end to end: the sink's writer's role, Eventarc's trigger, the functions, what Slack makes of the secret's URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from respawn import deployment
from respawn.logs import one_line

from . import endpoints, selftest_run

# Each Pub/Sub-triggered function, by the topic its trigger subscribes to.
TRIGGERED = {fn.trigger: fn for fn in deployment.FUNCTIONS if fn.trigger != "firestore"}


@dataclass(frozen=True)
class Check:
    ok: bool
    line: str


def mark(ok: bool, text: str) -> Check:
    return Check(ok, f"{'✓' if ok else '✗'} {text}")


def firestore_check(project: str) -> Check:
    from google.cloud import firestore

    try:
        endpoints.check(endpoints.FIRESTORE, project)
        firestore.Client(project=project).collection("jobs").limit(1).get(timeout=endpoints.CALL_DEADLINE_S)
    except endpoints.Unreachable as exc:
        return mark(False, str(exc))
    except Exception as exc:  # noqa: BLE001 - any refusal is the check's answer, in one line
        return mark(False, f"Firestore's (default) database cannot be read ({one_line(exc, 200)}): create it "
                            "once with "
                            "gcloud firestore databases create --location=nam5 (docs/deploy.md, step 2)")
    return mark(True, f"Firestore: the jobs' database answers ({endpoints.where(endpoints.FIRESTORE, project)})")


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
        return [mark(False, str(exc))]
    except Exception as exc:  # noqa: BLE001 - no credentials: one line
        return [mark(False, f"Pub/Sub cannot be asked ({one_line(exc, 200)}): gcloud auth "
                             "application-default login")]
    for topic, fn in TRIGGERED.items():
        path = publisher.topic_path(project, topic)
        try:
            publisher.get_topic(topic=path, timeout=endpoints.CALL_DEADLINE_S)
            subscriptions = list(publisher.list_topic_subscriptions(request={"topic": path},
                                                                    timeout=endpoints.CALL_DEADLINE_S))
        except exceptions.NotFound:
            checks.append(mark(False, f"topic {topic} does not exist: redeploy (cloudbuild.yaml, step topics)"))
            continue
        except Exception as exc:  # noqa: BLE001
            checks.append(mark(False, f"topic {topic} cannot be read ({one_line(exc, 200)}): the caller needs "
                                       "pubsub.topics.get and pubsub.topics.listSubscriptions"))
            continue
        if subscriptions:
            checks.append(mark(True, f"topic {topic} feeds {len(subscriptions)} subscription(s) ({fn.entry_point})"))
        else:
            checks.append(mark(False, f"topic {topic} has no subscription: {fn.name} is not deployed with its "
                                       f"trigger; redeploy (cloudbuild.yaml, step fn-{fn.entry_point.replace('_', '-')})"))
    return checks


def probe_checks(project: str, send: selftest_run.Senders, timeout: float,
                 say: Callable[[str], None]) -> list[Check]:
    answers = selftest_run.run(project, send, timeout=timeout, say=say)
    return [Check(ok, line) for ok, line in selftest_run.results(answers, timeout)]
