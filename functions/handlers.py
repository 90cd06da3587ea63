"""What each entry point does once its trigger is parsed. Every path ends in reconcile() (or Slack for alerts).

Acknowledge (return) what a retry cannot fix: malformed payloads, nodes no job owns, a job that does not exist.
Raise what a retry can fix: our own dependencies failing (Firestore, the Compute/TPU API, Slack 429/5xx).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from respawn.contract import LABEL_JOB
from respawn.deployment import ENV_SWEEP_TOPIC as SWEEP_TOPIC_VAR
from respawn import contract, logs, selftest
from respawn.schema import State

from . import events

if TYPE_CHECKING:
    from .reconcile import Deps

ACTIVE = {s.value for s in State if not s.terminal}


def job_created(job_id: str) -> None:
    from .reconcile import reconcile

    if (probe := selftest.probe_of_job(job_id)) is not None:
        _ack(probe, selftest.JOB_CREATED)  # the prober deletes the document
        return
    reconcile(job_id)


def log_event(entry: Any) -> None:
    if (probe := selftest.probe_of_entry(entry)) is not None:
        _ack(probe, selftest.LOG_EVENT)
        return
    try:
        sig = events.decode(entry)
    except events.Undecodable as exc:
        logs.info(f"log entry ignored: {exc}")
        return
    from .observation import Hint
    from .reconcile import Deps, reconcile

    if not sig.tpu_worker:
        result = reconcile(sig.job_id, Hint(sig.cause, sig.node, sig.at))
        if not result.found:
            logs.info(f"{sig.method} for {sig.node} in {sig.zone}: no job {sig.job_id} owns it; acknowledged",
                      node=sig.node, zone=sig.zone)
        return
    # A TPU worker VM (t1v-n-<hash>-w-<i>) does not carry the node name: one indexed lookup (status.zone ==)
    # finds the TPU jobs placed in its zone; reconcile asks the TPU API which of them lost its node.
    deps = Deps.default()
    owners = [job_id for job_id, doc in deps.store.jobs_in_zone(sig.zone)
              if ((doc.get("spec") or {}).get("accelerator") or {}).get("kind") == "tpu"
              and (doc.get("status") or {}).get("state", "PENDING") in ACTIVE]
    if not owners:
        logs.info(f"{sig.method} for TPU worker {sig.node} in {sig.zone}: no active TPU job there; acknowledged",
                  node=sig.node, zone=sig.zone)
    for job_id in owners:
        reconcile(job_id, deps=deps)


def sweep(message: Any) -> None:
    """{"task": "sweep"} (Cloud Scheduler's tick): list the active jobs and publish one {"task": "sweep", "job_id":
    ID, "swept_at": T} per job to the sweep topic, then scan for orphans. Each such message comes back to this
    function as an invocation of its own that reconciles that one job, so no job's slow operation holds back the
    others (docs/architecture.md, "The sweep"). {"task": "sweep", "job_id": ID} without swept_at: the CLI's nudge."""
    from .reconcile import reconcile

    if not isinstance(message, dict) or message.get("task") != "sweep":
        logs.warning(f"sweep message ignored: expected {{'task': 'sweep'}}, got {message!r}")
        return
    job_id = message.get("job_id")
    if job_id is None:
        try:
            _ack(selftest.TICKS, selftest.SWEEP, told=False)  # every tick: its fan-out's line says enough
        except Exception as exc:  # noqa: BLE001 - a tick's sweep must not wait on its self-test record
            logs.error(f"sweep: the tick's self-test record was not written: {type(exc).__name__}: {exc}; "
                       f"the controller needs write access to the Firestore database {selftest.DATABASE}")
        _fan_out()
        return
    if not isinstance(job_id, str) or not job_id:
        logs.warning(f"sweep message ignored: job_id must be a non-empty string, got {job_id!r}")
        return
    swept_at = message.get("swept_at")
    if swept_at is None:
        # The CLI's nudge, or an agent's (with a notice: its node is about to go, contract.notice_nudge). A failure
        # raises, and the platform redelivers it.
        reconcile(job_id, _notice_hint(job_id, message.get("notice")))
        return
    try:
        reconcile(job_id)
    except Exception as exc:  # noqa: BLE001 - acknowledged: the next tick sends this job again, and a redelivery
        # on top of it would only pile up reconciles of a job that keeps failing
        logs.error(f"sweep: reconciling {job_id} failed, the next sweep tries again: {type(exc).__name__}: {exc}",
                   job_id=job_id, swept_at=swept_at)


def _notice_hint(job_id: str, notice: Any) -> Any:
    """The observation.Hint of an agent's notice message; None without one, or (logged) when it is malformed."""
    from datetime import datetime

    from respawn.contract import NOTICE_RUN_ENDING
    from .observation import NOTICE, RUN_END_NOTICE, Hint

    if notice is None:
        return None
    try:
        node, at = notice["node"], datetime.fromisoformat(notice["at"])
        if not isinstance(node, str) or not node or at.tzinfo is None:
            raise ValueError("node must be a name and at an RFC 3339 time with its offset")
    except (KeyError, TypeError, ValueError) as exc:
        logs.warning(f"sweep: the notice of job {job_id} is malformed ({exc}); reconciling without it",
                     job_id=job_id, notice=repr(notice)[:300])
        return None
    logs.info(f"job {job_id}: {node} saw a {notice.get('kind', 'preemption')} notice", job_id=job_id, node=node)
    return Hint(RUN_END_NOTICE if notice.get("kind") == NOTICE_RUN_ENDING else NOTICE, node, at)


def _fan_out() -> None:
    from . import clients
    from .adapters import pubsub
    from .reconcile import Deps
    from .settings import ControlSettings

    settings = ControlSettings.from_env()
    deps = Deps.default(settings)
    jobs = deps.store.active_jobs()  # a failure raises: the platform redelivers the tick
    started = time.monotonic()
    published, failed = pubsub.publish_sweep(clients.default(settings), jobs, settings.sweep_topic,
                                             swept_at=deps.now().isoformat(),
                                             timeout=settings.sweep_publish_timeout_seconds)
    seconds = time.monotonic() - started
    logs.info(f"sweep: {published} of {len(jobs)} active job(s) sent to {settings.sweep_topic} in {seconds:.2f} s, "
              "one reconcile each", jobs=len(jobs), published=published, publish_seconds=round(seconds, 3))
    if failed:
        names = sorted(failed)
        job, why = names[0], failed[names[0]]
        logs.error(f"sweep: {len(failed)} job(s) not sent to {settings.sweep_topic}, the next sweep sends them again "
                   f"({job}: {why}); check that the topic exists ({SWEEP_TOPIC_VAR}) and that the controller may "
                   "publish to it (role respawnSweepPublisher, deploy/iam/permissions.yaml)", jobs=names[:100])
    every = None
    try:
        every = delete_orphans(deps)
    except Exception as exc:  # noqa: BLE001 - the next sweep scans again
        logs.error(f"sweep: orphan scan failed: {type(exc).__name__}: {exc}")
    expire_logs(deps, clients.default(settings), every)


def expire_logs(deps: Deps, c: Any, jobs: dict[str, dict] | None = None) -> None:
    """Each job's shipped logs older than its logs.retention_days are deleted, by one listing of the job's own logs
    prefix, once a day per job (respawn.joblogs.retention_due picks the tick); finished jobs too. `jobs`: every job's
    document as the orphan scan read it (None: read them here). A failure is logged and the job waits for its next
    day."""
    from respawn import deployment, joblogs
    from .adapters.logstore import LogRetention

    retention, now = LogRetention(c), deps.now().timestamp()
    for job_id, doc in sorted((deps.store.all_jobs() if jobs is None else jobs).items()):
        if not joblogs.retention_due(job_id, now, deployment.SWEEP_PERIOD_S):
            continue
        spec = doc.get("spec") or {}
        uri = spec.get("checkpoint_uri")
        days = (spec.get("logs") or {}).get("retention_days", contract.LOG_RETENTION_DAYS)
        if not isinstance(uri, str) or not uri.startswith(contract.CHECKPOINT_SCHEMES):
            continue
        try:
            deleted = retention.expire(uri, days, now)
        except Exception as exc:  # noqa: BLE001 - tomorrow's tick tries again
            logs.error(f"sweep: expiring the logs of {job_id} under {contract.logs_uri(uri)} failed: "
                       f"{type(exc).__name__}: {exc}; the controller needs storage.objects.list and "
                       "storage.objects.delete on the checkpoint bucket (role respawnLogRetention)", job_id=job_id)
            continue
        if deleted:
            logs.info(f"sweep: deleted {deleted} log chunk(s) of {job_id} older than {days} days", job_id=job_id,
                      deleted=deleted, retention_days=days)


def delete_orphans(deps: Deps) -> dict[str, dict]:
    """List the labelled nodes in every zone any job uses, then read the jobs, then delete what no placement owns.
    Returns every job's document as first read (the log retention goes through them next)."""
    from .models import queued
    from .orphans import Seen, orphans

    before = deps.store.all_jobs()
    scan = {(((doc.get("spec") or {}).get("accelerator") or {}).get("kind") or "gpu", zone)
            for doc in before.values() for zone in ((doc.get("spec") or {}).get("zones") or [])}
    # Where TPU nodes may be, their queued resources may be too (any job's, whatever its spec says now).
    scan |= {(queued.PROVIDER, zone) for kind, zone in scan if kind == "tpu" and queued.PROVIDER in deps.providers}
    seen = []
    for kind, zone in sorted(scan):
        try:
            seen += [Seen(kind, zone, name, labels) for name, labels in deps.providers[kind].list_labelled(zone)]
        except Exception as exc:  # noqa: BLE001 - a zone whose listing fails (an answer the client cannot decode,
            # a 5xx) is left for the next sweep; nothing of it is deleted unseen, and the other zones are scanned
            logs.error(f"sweep: listing {kind} nodes in {zone} failed, its orphans wait for the next sweep: "
                       f"{type(exc).__name__}: {exc}", zone=zone)
    jobs = {job_id: (doc.get("status") or {}) for job_id, doc in deps.store.all_jobs().items()}
    for n in orphans(seen, jobs):
        what = "queued resource" if n.kind == queued.PROVIDER else "node"
        logs.warning(f"sweep: deleting orphan {what} {n.name} in {n.zone} (job {n.labels.get(LABEL_JOB)} does not "
                     "own it now)", node=n.name, zone=n.zone)
        deps.providers[n.kind].delete(n.zone, n.name)
    return before


def alert(message: Any) -> None:
    from . import alerts
    from .adapters import slack
    from .settings import ControlSettings

    if (probe := selftest.probe_of_alert(message)) is not None:
        _probe_alert(probe)
        return
    try:
        payload = alerts.to_slack(message)
    except alerts.BadAlert as exc:
        logs.warning(f"alert message ignored: {exc}")
        return
    settings = ControlSettings.from_env()
    url = settings.slack_webhook_url
    if not url:
        logs.warning("alert not sent: SLACK_WEBHOOK_URL is not set (deploy sets it from Secret Manager)", alert=message)
        return
    if slack.post(url, payload, attempts=settings.slack_attempts, backoff=settings.slack_backoff_seconds):
        logs.info(f"alert sent to Slack: {message.get('type')} for {message.get('job_id')}")


def _ack(doc: str, link: selftest.Link, detail: str = "", told: bool = True) -> None:
    from . import clients
    from .adapters import selftest_acks
    from .settings import ControlSettings

    selftest_acks.ack(clients.default(ControlSettings.from_env()), doc, link, detail)
    if told:
        logs.info(f"self-test: {link.function} answered probe {doc}", selftest=doc, link=link.key)


def _probe_alert(probe: str) -> None:
    """The self-test's alert: one "Respawn is deployed" message to Slack when it is configured, then the
    acknowledgement, which says what Slack answered."""
    from .adapters import slack
    from .settings import ControlSettings

    settings = ControlSettings.from_env()
    detail = selftest.SLACK_UNSET
    if settings.slack_webhook_url:
        try:
            sent = slack.post(settings.slack_webhook_url, {"text": selftest.SLACK_DEPLOYED},
                              attempts=settings.slack_attempts, backoff=settings.slack_backoff_seconds)
            detail = selftest.SLACK_SENT if sent else "Slack refused the message (check the webhook URL in the secret)"
        except slack.SlackUnavailable as exc:
            detail = f"Slack did not take the message: {exc}"
    _ack(probe, selftest.ALERT, detail)
