"""The deployment's self-test and `respawn doctor` on a deployment to the local stand-ins: whole, every check passes
and every path answers; with one link broken at a time (a topic gone, a function's trigger gone, the Logging sink's
filter changed, the sink deleted, the scheduler job paused, the scheduler gone, an API disabled, a role binding and
the Pub/Sub service agent's grant removed, a node service account deleted, the Slack secret's version disabled, a
Firestore composite index deleted and then still building, Eventarc stopped, Slack refusing the webhook), that link
and only that one is found and named: by its static check where `respawn doctor` has one, and by its probe where the
stand-ins play the link (they do not obey the record of the APIs, accounts, policy, secret and indexes:
sim/project.py). A probe that does not answer is waited for: links on separate probe paths are broken together, each
named by its own lines and nothing else failing, a path still answering each time."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import requests

from deploy import firestore_indexes, render
from respawn import audit, deployment, selftest
from respawn.app import doctor, project_checks, selftest_run
from sim import cloud_scheduler, emulators, functions_host
from sim.audit_router import AuditRouter
from sim.bridges import EventarcBridge, SweepScheduler
from sim.slack import SlackReceiver
from tests import respawn_forks
from tests.sim_fixtures import sim_factory  # noqa: F401 - a fixture

PROJECT = "respawn-selftest-stand-ins"  # a project of its own on the session's emulators
BROKEN_WAIT_S = 8.0  # how long a broken link is waited for: a whole one answers within a second here, 8 s on a
# loaded machine


@pytest.fixture
def deployment_stand_ins(firestore_emulator, pubsub_emulator, sim_factory, tmp_path):  # noqa: F811
    """The demo's deployment without its job: the four functions served and triggered, the sink, the scheduler
    (a tick a second), Eventarc, Slack."""
    slack = SlackReceiver().start()
    router = AuditRouter(PROJECT, topic=deployment.LOG_EVENTS_TOPIC)
    sim = sim_factory(project=PROJECT, audit_sink=router, boot_command=None)
    env = {**os.environ, "RESPAWN_PROJECT": PROJECT, deployment.ENV_COMPUTE_ENDPOINT: sim.endpoint,
           "RESPAWN_TPU_ENDPOINT": sim.endpoint, deployment.ENV_ALERTS_TOPIC: deployment.ALERTS_TOPIC,
           deployment.ENV_SWEEP_TOPIC: deployment.SWEEP_TOPIC, deployment.ENV_SLACK_WEBHOOK_URL: slack.url,
           "RESPAWN_SLACK_BACKOFF_SECONDS": "0.1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "functions.log"
    with open(log, "wb") as out:
        proc, urls = functions_host.start(env, emulators.free_port(), out, log)
    parts = {"slack": slack, "router": router, "sim": sim, "urls": urls, "log": log}
    try:
        functions_host.subscribe(PROJECT, urls)
        parts["eventarc"] = EventarcBridge(PROJECT, urls["on_job_created"]).start()
        parts["scheduler"] = SweepScheduler(PROJECT, topic=deployment.SWEEP_TOPIC, interval=1.0).start()
        yield parts
    finally:
        for name in ("scheduler", "eventarc"):
            if name in parts:
                parts[name].stop()
        emulators.delete_pubsub(pubsub_emulator, PROJECT, "subscriptions")
        emulators.stop_groups([proc])
        router.close()
        slack.stop()


def test_without_firestore_the_doctor_says_so_and_sends_no_probe(tmp_path, pubsub_emulator):
    env = {**os.environ, "GOOGLE_CLOUD_PROJECT": PROJECT, "FIRESTORE_EMULATOR_HOST": f"127.0.0.1:{emulators.free_port()}"}
    done = respawn_forks.run(["doctor", "--timeout", "5"], Path.cwd(), env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "✗ the Firestore emulator at 127.0.0.1:" in done.stdout and "does not answer" in done.stdout
    assert "✗ the self-test's probes were not sent: they need Firestore (above)" in done.stdout
    assert "self-test " not in done.stdout.replace("the self-test's probes", "")  # nothing was sent
    assert "doctor: " in done.stderr and "Traceback" not in done.stderr


def test_the_project_checks_follow_the_pool_and_say_what_they_could_not_check(sim_factory, monkeypatch):  # noqa: F811
    """--node-identities is the pool checked (the stand-ins' build made the default 8); without the checkout's
    deploy/, the project's roles are not checked, and the line says so and how, while the rest are."""
    sim = sim_factory(project=PROJECT, boot_command=None)
    api = project_checks.rest(sim.endpoint)
    assert project_checks.service_account_check(PROJECT, 3, api).ok
    missing = project_checks.service_account_check(PROJECT, 10, api)
    assert missing.line.startswith("✗ service accounts: missing: respawn-node-9, respawn-node-10: redeploy"), missing
    [roles, agent] = project_checks.binding_checks(PROJECT, 10, api)
    assert roles.line.startswith("✗ roles not bound on the project: respawnNode to respawn-node-9@"), roles
    assert agent.ok, agent
    monkeypatch.setattr(project_checks, "_render", lambda: None)
    [roles, agent] = project_checks.binding_checks(PROJECT, 3, api)
    assert roles.line.startswith("✗ the roles bound on the project were not checked: they are read from "
                                 "deploy/iam/permissions.yaml"), roles
    assert agent.line == ("✓ the Pub/Sub service agent holds roles/iam.serviceAccountTokenCreator (Eventarc's "
                          "Pub/Sub triggers)")
    assert project_checks.index_check(PROJECT, api).line.startswith(
        "✗ the Firestore composite indexes were not checked: they are read from deploy/firestore/indexes.yaml")


# The composite indexes the stand-ins' build is checked against: deploy/firestore/indexes.yaml wants none today, so
# the test's own file wants one, made as the build's `firestore` step makes it.
INDEXES = """indexes:
- collection_group: jobs
  fields: [{field: status.state, order: ascending}, {field: status.next_attempt_at, order: ascending}]
"""


def _create_index(sim, ix: dict) -> requests.Response:
    """`gcloud firestore indexes composite create --database='(default)' ARGS` (deploy/firestore_indexes.py's ARGS)
    against the sim's Firestore Admin API."""
    fields = [dict(p.split("=", 1) for p in config.split(",")) for config in ix["field_config"]]
    made = requests.post(f"{sim.endpoint}/v1/projects/{PROJECT}/databases/(default)/collectionGroups/"
                         f"{ix['collection_group']}/indexes",
                         json={"queryScope": "COLLECTION", "fields": [
                             {"fieldPath": f["field-path"], "order": f["order"].upper()} for f in fields]}, timeout=10)
    made.raise_for_status()
    return made


def _doctor(sim, timeout: float = BROKEN_WAIT_S, indexes: Path | None = None) -> list[doctor.Check]:
    send = selftest_run.senders(PROJECT, None, sim.endpoint)  # the sim's Cloud Logging; the scheduler's own ticks
    return [doctor.firestore_check(PROJECT), *doctor.topic_checks(PROJECT),
            *project_checks.deployment_checks(PROJECT, None, sim.endpoint, indexes=indexes),
            *doctor.probe_checks(PROJECT, send, timeout, lambda line: None)]


def _failed(checks: list[doctor.Check]) -> list[str]:
    return [c.line for c in checks if not c.ok]


def test_a_whole_deployment_passes_and_each_broken_link_is_named(deployment_stand_ins, pubsub_emulator, tmp_path):
    parts = deployment_stand_ins
    sim, slack = parts["sim"], parts["slack"]
    # The build's `firestore` step with the test's indexes: what the listing lacks, created.
    indexes = tmp_path / "indexes.yaml"
    indexes.write_text(INDEXES)
    admin = f"{sim.endpoint}/v1/projects/{PROJECT}/databases/(default)/collectionGroups"
    listed = requests.get(f"{admin}/-/indexes", timeout=10).json().get("indexes", [])
    wanted = render.indexes(indexes)
    assert len(firestore_indexes.missing(wanted, listed)) == 1
    for ix in wanted:
        _create_index(sim, ix)

    # Whole: `respawn doctor` itself, as a user runs it in a demo's --keep shell.
    env = {**os.environ, "GOOGLE_CLOUD_PROJECT": PROJECT, deployment.ENV_COMPUTE_ENDPOINT: sim.endpoint}
    done = respawn_forks.run(["doctor", "--timeout", "30", "--indexes", str(indexes)], Path.cwd(), env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for link in selftest.LINKS:
        assert f"✓ {link.function} answered in" in done.stdout, done.stdout
    assert '✓ Slack took the message "Respawn is deployed"' in done.stdout
    sink = requests.get(f"{sim.endpoint}/v2/projects/{PROJECT}/sinks/{deployment.SINK}", timeout=10).json()
    assert (f"✓ Logging sink {deployment.SINK} routes respawn/audit.py's filter to {deployment.LOG_EVENTS_TOPIC}; "
            f"its writer {sink['writerIdentity']} needs roles/pubsub.publisher there") in done.stdout, done.stdout
    assert (f"✓ scheduler job {deployment.SCHEDULER_JOB} (us-central1) is enabled: {deployment.SWEEP_SCHEDULE} "
            f"(Etc/UTC) to {deployment.SWEEP_TOPIC}") in done.stdout, done.stdout
    for line in (f"✓ the {len(deployment.APIS)} APIs the deployment uses are enabled",
                 f"✓ service accounts: {deployment.CONTROLLER_SA}, {deployment.NOTIFIER_SA}, {deployment.TRIGGER_SA} "
                 f"and the {deployment.DEFAULT_NODE_IDENTITIES} node identities exist",
                 "✓ the Pub/Sub service agent holds roles/iam.serviceAccountTokenCreator",
                 f"✓ Slack secret {deployment.DEFAULT_SLACK_SECRET}: its latest version (1) is enabled",
                 f"✓ Firestore composite indexes: all 1 of {indexes} are READY in (default)"):
        assert line in done.stdout, done.stdout
    assert re.search(r"✓ the \d+ role bindings the deployment makes on the project are there", done.stdout)
    assert done.stdout.rstrip().endswith("checks passed"), done.stdout
    assert [p["text"] for p in slack.payloads] == [selftest.SLACK_DEPLOYED]
    assert "Traceback" not in done.stderr

    def broken(expected: list[str]) -> None:
        """The failed lines are the expected ones, each named once (in any order), and no other."""
        failed = _failed(_doctor(sim, indexes=indexes))
        assert len(failed) == len(expected), failed
        for words in expected:
            assert len([line for line in failed if words in line]) == 1, (words, failed)

    # A probe that does not answer is waited for BROKEN_WAIT_S: the links broken on separate paths (each has its
    # own probe) are broken together, a path or two still answering each time, and each is named by its own lines.
    # 1. The log-events topic gone: the sink cannot publish; the static check and the probe both say so. on_alert's
    # trigger gone (the function not deployed): the alert path. Eventarc's Firestore trigger stopped: the job
    # document reaches no one. The sweep still answers.
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    topic = publisher.topic_path(PROJECT, deployment.LOG_EVENTS_TOPIC)
    publisher.delete_topic(topic=topic)
    subscriber = pubsub_v1.SubscriberClient()
    alert_fn = next(fn for fn in deployment.FUNCTIONS if fn.entry_point == "on_alert")
    subscriber.delete_subscription(subscription=subscriber.subscription_path(PROJECT, f"{alert_fn.name}-push"))
    parts["eventarc"].stop()
    broken([f"topic {deployment.LOG_EVENTS_TOPIC} does not exist",
            "on_log_event did not answer in 8 s (a log entry → the Logging sink",
            f"topic {deployment.ALERTS_TOPIC} has no subscription: {alert_fn.name} is not deployed",
            "on_alert did not answer in 8 s",
            "on_job_created did not answer in 8 s (a job document → Eventarc"])
    assert sim.cloud_logging.sink_errors, "the sink's publish to the deleted topic did not fail"
    emulators.delete_pubsub(pubsub_emulator, PROJECT, "subscriptions")
    functions_host.subscribe(PROJECT, parts["urls"])  # redeployed: the topic and every trigger again
    parts["eventarc"] = EventarcBridge(PROJECT, parts["urls"]["on_job_created"]).start()

    # 2. The sink's filter changed (as `gcloud logging sinks update --log-filter` would): no probe reaches
    # on_log_event, and the sink's line says why; the scheduler job paused (`gcloud scheduler jobs pause`): no tick
    # reaches on_sweep. The job document and the alert still answer.
    sinks = f"{sim.endpoint}/v2/projects/{PROJECT}/sinks"
    requests.put(f"{sinks}/{deployment.SINK}", params={"updateMask": "filter"}, json={"filter": "severity>=ERROR"},
                 timeout=10).raise_for_status()
    job = cloud_scheduler.job_name(PROJECT, "us-central1")
    requests.post(f"{sim.endpoint}/v1/{job}:pause", json={}, timeout=10).raise_for_status()
    broken([f"✗ Logging sink {deployment.SINK} has another filter than respawn/audit.py builds",
            "on_log_event did not answer in 8 s (a log entry → the Logging sink",
            f"✗ scheduler job {deployment.SCHEDULER_JOB} (us-central1) is PAUSED: gcloud scheduler jobs resume "
            f"{deployment.SCHEDULER_JOB} --location=us-central1",
            "on_sweep did not answer in 8 s (a Cloud Scheduler tick"])
    requests.post(f"{sim.endpoint}/v1/{job}:resume", json={}, timeout=10).raise_for_status()

    # 3. The sink deleted, and the scheduler gone (its job deleted): the same paths, and their lines say so.
    requests.delete(f"{sinks}/{deployment.SINK}", timeout=10).raise_for_status()
    parts["scheduler"].stop()
    broken([f"✗ Logging sink {deployment.SINK} does not exist: no audit event reaches on_log_event",
            "on_log_event did not answer in 8 s (a log entry → the Logging sink",
            f"✗ scheduler job {deployment.SCHEDULER_JOB} does not exist in us-central1",
            "on_sweep did not answer in 8 s (a Cloud Scheduler tick"])
    made = {"name": deployment.SINK, "filter": audit.sink_filter(PROJECT),
            "destination": f"pubsub.googleapis.com/projects/{PROJECT}/topics/{deployment.LOG_EVENTS_TOPIC}"}
    requests.post(sinks, params={"uniqueWriterIdentity": "true"}, json=made, timeout=10).raise_for_status()
    parts["scheduler"] = SweepScheduler(PROJECT, topic=deployment.SWEEP_TOPIC, interval=1.0).start()

    # What the build made in the project, each broken through its API as gcloud would break it: that check's line
    # alone names it (every probe still answers: the stand-ins do not obey this record, sim/project.py).
    v1 = f"{sim.endpoint}/v1/projects/{PROJECT}"
    requests.post(f"{v1}/services/eventarc.googleapis.com:disable", json={}, timeout=10).raise_for_status()
    broken(["✗ APIs not enabled: eventarc.googleapis.com: gcloud services enable eventarc.googleapis.com"])
    requests.post(f"{v1}/services/eventarc.googleapis.com:enable", json={}, timeout=10).raise_for_status()

    def set_policy(bindings: list[dict]) -> None:  # `gcloud projects set-iam-policy`, the etag of the policy read
        policy = requests.post(f"{v1}:getIamPolicy", json={"options": {"requestedPolicyVersion": 3}}, timeout=10)
        requests.post(f"{v1}:setIamPolicy", json={"policy": {**policy.json(), "bindings": bindings}},
                      timeout=10).raise_for_status()

    built = requests.post(f"{v1}:getIamPolicy", json={"options": {"requestedPolicyVersion": 3}}, timeout=10).json()
    controller = deployment.service_account_email(deployment.CONTROLLER_SA, PROJECT)
    set_policy([b for b in built["bindings"] if not b["role"].endswith("/respawnController")])
    broken([f"✗ roles not bound on the project: respawnController to {controller}: redeploy (cloudbuild.yaml, step "
            "bindings)"])
    agent = f"serviceAccount:{deployment.pubsub_service_agent(sim.project_record.number)}"
    set_policy([{**b, "members": [m for m in b["members"] if m != agent]} for b in built["bindings"]])
    broken(["✗ the Pub/Sub service agent lacks roles/iam.serviceAccountTokenCreator: in a project that enabled "
            f"Pub/Sub on or before 2021-04-08, on_log_event, on_sweep and on_alert get no events: gcloud projects "
            f"add-iam-policy-binding {PROJECT} --member={agent} --role=roles/iam.serviceAccountTokenCreator"])
    set_policy(built["bindings"])

    # A node identity deleted: its account is missing, and its bindings name a deleted principal now, so they are
    # missing too; made again, it is bound to nothing until the build's bindings step runs again.
    node = deployment.service_account_email(deployment.node_identity(2), PROJECT)
    requests.delete(f"{v1}/serviceAccounts/{node}", timeout=10).raise_for_status()
    broken([f"✗ service accounts: missing: {deployment.node_identity(2)}: redeploy",
            f"✗ roles not bound on the project: respawnNode to {node}"])
    requests.post(f"{v1}/serviceAccounts", json={"accountId": deployment.node_identity(2)},
                  timeout=10).raise_for_status()
    broken([f"✗ roles not bound on the project: respawnNode to {node}"])
    set_policy(built["bindings"])

    # The Slack secret's latest version disabled (`gcloud secrets versions disable`).
    secret = f"{v1}/secrets/{deployment.DEFAULT_SLACK_SECRET}/versions/1"
    requests.post(f"{secret}:disable", json={}, timeout=10).raise_for_status()
    broken([f"✗ Slack secret {deployment.DEFAULT_SLACK_SECRET}: its latest version (1) is DISABLED"])
    requests.post(f"{secret}:enable", json={}, timeout=10).raise_for_status()

    # The composite index deleted (`gcloud firestore indexes composite delete ID`): its line names it and the command
    # that makes it again; made again, it is named as still building until it is READY (the sim's build time, 0 s
    # until set: Google's take minutes). No probe notices: the emulator enforces no index.
    [index] = requests.get(f"{admin}/-/indexes", timeout=10).json()["indexes"]
    requests.delete(f"{sim.endpoint}/v1/{index['name']}", timeout=10).raise_for_status()
    create = (f"gcloud firestore indexes composite create --database='(default)' --project={PROJECT} "
              "--collection-group=jobs --field-config=field-path=status.state,order=ascending "
              "--field-config=field-path=status.next_attempt_at,order=ascending")
    broken([f"✗ Firestore composite indexes of (default) ({indexes}): jobs (status.state ascending, "
            f"status.next_attempt_at ascending) is missing: {create}"])
    sim.project_record.index_build_s = 3600.0
    _create_index(sim, wanted[0])
    broken([f"✗ Firestore composite indexes of (default) ({indexes}): jobs (status.state ascending, "
            "status.next_attempt_at ascending) is still building (CREATING"])
    sim.project_record.index_build_s = 0.0

    # A wrong Slack secret: Slack refuses the webhook; on_alert answers and says so.
    slack.fail(status=404, count=-1)
    broken(["✗ Slack: Slack refused the message"])
    slack.recover()

    # A probe that cannot leave (the caller may not write logs) is that path's failure, in one line; the rest answer.
    def refused(entry):
        raise PermissionError("403 Permission 'logging.logEntries.create' denied")

    checks = doctor.probe_checks(PROJECT, selftest_run.Senders(refused, None), BROKEN_WAIT_S, lambda line: None)
    assert _failed(checks) == ["✗ the probe for on_log_event could not be sent: 403 Permission "
                               "'logging.logEntries.create' denied (the caller needs logging.logEntries.create)"]

    # Mended, it passes again; the probes left nothing behind (the job document, the probe's record).
    assert not _failed(_doctor(sim, timeout=30))
    from google.cloud import firestore

    assert not [d.id for d in firestore.Client(project=PROJECT).collection("jobs").stream()]
    left = [d.id for d in firestore.Client(project=PROJECT, database=selftest.DATABASE)
            .collection(selftest.COLLECTION).stream()]
    assert left == [selftest.TICKS], left
