"""The self-test's sending side (respawn.selftest has the protocol): one probe down each link, then the wait for each
function's acknowledgement, a line per link as it answers. `respawn doctor` and the build's last step run it; so does
the demo, against its stand-ins.

What sends the probes, with the caller's own credentials: a log entry written to Cloud Logging (the sim's
entries.write in local runs), a run of the scheduler job (or, where none can be forced, the wait for its next tick),
a job document in Firestore (deleted at the end), an alert published to the alerts topic.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

from respawn import deployment, selftest
from respawn.logs import one_line
from respawn.schema import JOBS

TIMEOUT_S = 180.0  # a routed log entry can take a minute to reach its sink's topic; a function's cold start, seconds
POLL_S = 0.5
PROGRESS_EVERY_S = 15.0
LOGGING_HOST = "https://logging.googleapis.com"
SCHEDULER_HOST = "https://cloudscheduler.googleapis.com"


@dataclass(frozen=True)
class Answer:
    link: selftest.Link
    seconds: float | None  # None: no answer in time
    detail: str = ""  # on_alert's word on Slack; for a probe that could not be sent, why

    @property
    def ok(self) -> bool:
        return self.seconds is not None

    def line(self, timeout: float) -> str:
        if self.ok:
            return f"✓ {self.link.function} answered in {self.seconds:.1f} s ({self.link.path})"
        if self.detail:
            return f"✗ the probe for {self.link.function} could not be sent: {self.detail}"
        return (f"✗ {self.link.function} did not answer in {timeout:.0f} s ({self.link.path}): check that "
                f"{self.link.cause}")


def slack_line(answer: Answer) -> tuple[bool, str]:
    """(ok, line) for Slack, from what on_alert said in its acknowledgement."""
    if answer.detail == selftest.SLACK_SENT:
        return True, "✓ Slack took the message \"Respawn is deployed\""
    if answer.detail == selftest.SLACK_UNSET:
        return True, "– Slack is not configured: alerts are logged only (docs/deploy.md, step 3)"
    return False, (f"✗ Slack: {answer.detail}; put the channel's webhook URL in the Slack secret (the build's "
                   "_SLACK_SECRET, respawn-slack-webhook by default) and redeploy (docs/deploy.md, step 3)")


@dataclass
class Senders:
    """How each probe leaves this machine: real services, or the local stand-ins."""

    write_log: Callable[[dict], None]
    tick: Callable[[], None] | None  # forces a scheduler tick; None: the next one is waited for


def senders(project: str, region: str | None, local: str | None = None) -> Senders:
    """Against the sim at `local` (by default where respawn.deployment.ENV_COMPUTE_ENDPOINT points: it serves Cloud
    Logging too, and the stand-ins' scheduler ticks on its own), else Google's APIs with this machine's
    credentials."""
    local = local or os.environ.get(deployment.ENV_COMPUTE_ENDPOINT)
    if local:
        import requests

        def write_local(entry: dict) -> None:
            r = requests.post(f"{local.rstrip('/')}/v2/entries:write", json={"entries": [entry]}, timeout=10)
            r.raise_for_status()

        return Senders(write_local, None)
    return google_senders(project, region, google_session())


def google_session():
    """A requests session authorized with this machine's credentials (google.auth's DefaultCredentialsError where
    it has none)."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def google_senders(project: str, region: str | None, session, logging_host: str = LOGGING_HOST,
                   scheduler_host: str = SCHEDULER_HOST) -> Senders:
    """Cloud Logging's entries.write and Cloud Scheduler's jobs.run (the scheduler job of `region`; none without
    one), through `session` (an authorized requests session)."""
    def write(entry: dict) -> None:
        session.post(f"{logging_host}/v2/entries:write", json={"entries": [entry]}, timeout=30).raise_for_status()

    def tick() -> None:
        job = f"projects/{project}/locations/{region}/jobs/{deployment.SCHEDULER_JOB}"
        session.post(f"{scheduler_host}/v1/{job}:run", json={}, timeout=30).raise_for_status()

    return Senders(write, tick if region else None)


def run(project: str, send: Senders, *, timeout: float = TIMEOUT_S, say: Callable[[str], None] = print,
        now: Callable[[], float] = time.time) -> list[Answer]:
    """Send every probe and wait for every answer (or the timeout); each answer is said as it comes, and what is
    still awaited every PROGRESS_EVERY_S. The probe's job document and acknowledgements are deleted at the end."""
    from google.cloud import firestore, pubsub_v1

    probe, started = selftest.new_probe(), now()
    acks = firestore.Client(project=project, database=selftest.DATABASE).collection(selftest.COLLECTION)
    job = firestore.Client(project=project).collection(JOBS).document(selftest.probe_job_id(probe))
    publisher = pubsub_v1.PublisherClient()
    say(f"self-test {probe}: a probe down each of {len(selftest.LINKS)} paths, waiting up to {timeout:.0f} s")
    if send.tick is None:
        say(f"self-test: waiting for the scheduler's next tick (every {deployment.SWEEP_PERIOD_S:.0f} s in a "
            "deployment)")
    sends = {
        selftest.LOG_EVENT: (lambda: send.write_log(selftest.probe_entry(project, probe)),
                             "the caller needs logging.logEntries.create"),
        selftest.SWEEP: (send.tick or (lambda: None), f"the caller needs cloudscheduler.jobs.run on "
                                                      f"{deployment.SCHEDULER_JOB}"),
        selftest.JOB_CREATED: (lambda: job.set({"selftest": probe, "created_at": started}),
                               "the caller needs to write Firestore's (default) database"),
        selftest.ALERT: (lambda: publisher.publish(publisher.topic_path(project, deployment.ALERTS_TOPIC),
                                                   json.dumps(selftest.probe_alert(probe)).encode()).result(timeout=30),
                         f"the caller needs pubsub.topics.publish on {deployment.ALERTS_TOPIC}"),
    }
    unsent = {}
    try:
        for link, (act, needs) in sends.items():
            try:
                act()
            except Exception as exc:  # noqa: BLE001 - a probe that cannot leave is that link's answer, in one line
                unsent[link.key] = Answer(link, None, f"{one_line(exc, 200)} ({needs})")
                say(unsent[link.key].line(timeout))
        answers = _wait(acks, probe, started, timeout, say, unsent)
        alert = next(a for a in answers if a.link is selftest.ALERT)
        if alert.ok:
            say(slack_line(alert)[1])
        return answers
    finally:
        for what, remove in ((f"the probe job {job.path}", job.delete),
                             (f"the probe's answers {selftest.DATABASE}/{acks.id}/{probe}", acks.document(probe).delete)):
            try:
                remove()
            except Exception as exc:  # noqa: BLE001 - said, and the answers stand
                say(f"self-test: {what} was not deleted ({one_line(exc, 200)}); delete it by hand")
        publisher.stop()


def _wait(acks, probe: str, started: float, timeout: float, say, unsent: dict[str, Answer]) -> list[Answer]:
    """Each sent probe's answer, or its absence at the timeout; `unsent` (by link key) as they are."""
    answers: dict[str, Answer] = dict(unsent)
    deadline, next_word = time.monotonic() + timeout, time.monotonic() + PROGRESS_EVERY_S
    while True:
        got = acks.document(probe).get().to_dict() or {}
        tick = ((acks.document(selftest.TICKS).get().to_dict() or {}).get(selftest.SWEEP.key) or {})
        if (tick.get("at") or 0) >= started:
            got[selftest.SWEEP.key] = tick
        for link in selftest.LINKS:
            if link.key in got and link.key not in answers:
                answers[link.key] = Answer(link, max(0.0, got[link.key]["at"] - started), got[link.key].get("detail", ""))
                say(answers[link.key].line(timeout))
        if len(answers) == len(selftest.LINKS) or time.monotonic() > deadline:
            break
        if time.monotonic() > next_word:
            left = [link.function for link in selftest.LINKS if link.key not in answers]
            say(f"self-test: waiting for {', '.join(left)} ({timeout - (deadline - time.monotonic()):.0f} s of "
                f"{timeout:.0f} s)")
            next_word += PROGRESS_EVERY_S
        time.sleep(POLL_S)
    for link in selftest.LINKS:
        if link.key not in answers:
            answers[link.key] = Answer(link, None)
            say(answers[link.key].line(timeout))
    return [answers[link.key] for link in selftest.LINKS]


def results(answers: list[Answer], timeout: float) -> list[tuple[bool, str]]:
    """(ok, line) for each path, in selftest.LINKS' order, then for Slack once on_alert answered."""
    out = [(a.ok, a.line(timeout)) for a in answers]
    alert = next(a for a in answers if a.link is selftest.ALERT)
    return out + [slack_line(alert)] if alert.ok else out
