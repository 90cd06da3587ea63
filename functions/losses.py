"""How a lost node counts (pure): a preemption, a failure of the job's own, a boot failure or a planned stop
(`loss_kind`); the limit a loss goes past (`give_up`); the wait before the next node; and the loss record's words
(the life that ended, the emergency save, the failure's message and the alerts' fields). functions/decide.py counts
a slot's loss with them (`_lose`, `_count_loss`), functions/job.py a job's."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal, Mapping

from respawn import losswords
from respawn.schema import (CONSOLE_TAIL_CHARS, MAX_PREEMPTION_TIMES, Heartbeat, JobSpec, Leaving, MemberStatus,
                            SlotStatus)

from . import models, recovery_time
from .observation import Observation, noticed


# Why a node was lost → what it counts as. A failure is the job's own doing: its trainer crashed, or its agent
# stopped reporting while the VM ran (a hang, an agent killed) without having seen a notice. A boot failure: the
# node served past its boot grace and its agent never reported (a broken image, a failing startup script, an agent
# that cannot install). Every other cause is the platform taking the node: a preemption (preempted, host error,
# stopped, deleted or gone from outside, a notice seen by the agent).
FAILURE_CAUSES = recovery_time.FAILURES  # unreachable: job.UNREACHABLE
BOOT_FAILURE = recovery_time.NO_HEARTBEAT
BOOT_FAILURES_TO_FAIL = 2  # boots in a row whose agent never reported: the second ends the job
# A run that ended as its model planned (models.Model.loss_cause: its agent's notice of it, or a loss near the end):
# a planned stop (models.RUN_ENDED). The next node is made as after a loss, but it counts as neither a preemption
# nor a failure, and its zone is not avoided.
RUN_ENDED = models.RUN_ENDED
LossKind = Literal["preemption", "failure", "boot_failure", "planned"]


def loss_kind(cause: str, hb: Heartbeat | None) -> LossKind:
    if cause == BOOT_FAILURE:
        return "boot_failure"
    if cause == RUN_ENDED:
        return "planned"
    if cause in FAILURE_CAUSES and not (hb is not None and noticed(hb)):
        return "failure"
    return "preemption"


def console(o: Observation, node: str | None) -> str:
    """The tail of the lost node's console as recorded: what observe() read, or why there is none."""
    if node is None or node not in o.consoles:
        return "(the console was not read)"
    tail = o.consoles[node]
    if tail is None:
        return ("(no console: the Cloud TPU API has no serial port output; "
                "`gcloud compute tpus tpu-vm ssh NODE --zone ZONE --command 'sudo journalctl -u google-startup-scripts'` "
                "while a node is up shows the startup script's log)")
    return tail[-CONSOLE_TAIL_CHARS:]


def boot_help(spec: JobSpec, node: str | None, grace: float) -> str:
    """What to check when no agent ever reported: named concretely for the job's kind of node."""
    if spec.accelerator.kind == "tpu":
        boots = f"the TPU runtime version ({spec.accelerator.runtime_version})"
    else:
        boots = f"the boot image ({spec.accelerator.boot_image}: it must have python3 3.9+ and curl or gsutil)"
    return (f"no agent heartbeat from {node} within {int(grace)} s of its boot, twice in a row: check {boots}; "
            "the startup script (metadata startup-script: its JSON lines in the console tail below name the step "
            "that failed); the agent's install (metadata respawn-agent names the release the node downloads: the "
            "node's service account must read it, and the node must reach storage.googleapis.com and "
            "firestore.googleapis.com)")


def recent(s: SlotStatus, spec: JobSpec, now: datetime) -> list[datetime]:
    """The preemption times the rate needs, this one included, newest last."""
    times = [*s.preempted_times, now]
    rate = spec.preemption_rate
    if rate is not None:
        times = [t for t in times if t > now - timedelta(hours=rate.window_hours)]
    else:
        times = times[-1:]
    return times[-MAX_PREEMPTION_TIMES:]


def backoff(spec: JobSpec, o: Observation, n: int) -> float:
    """The wait before the next node after the n-th failure in a row (or the n-th preemption over the rate)."""
    return min(float(spec.placement.max_backoff_seconds), o.settings.backoff_base_seconds * 2 ** min(max(n - 1, 0), 20))


def lost_life(s: MemberStatus, hb: Heartbeat | None) -> dict[str, Any]:
    """The lost node's trainer as its last heartbeat said (times as RFC 3339 text)."""
    life: dict[str, Any] = {"node": s.node}
    if hb is not None:
        for key in ("step", "committed_step", "first_step"):
            life[key] = getattr(hb, key)
        for key in ("started_at", "first_step_at", "heartbeat_at"):
            at = getattr(hb, key)
            life[key] = at.isoformat() if at is not None else None
    return life


def lost_words(s: MemberStatus, cause: str, exit_code: int | None, error: str | None) -> str:
    """A failure as its status message says it: 'trainer exited 1 on job-3 (ValueError: bad learning rate)'."""
    if cause == "trainer_crashed":
        return f"trainer exited {exit_code} on {s.node}" + (f" ({error})" if error else "")
    return f"{s.node} failed ({cause}" + (f": {error})" if error else ")")


def emergency(hb: Heartbeat | None, leaving: Leaving | None) -> dict[str, Any] | None:
    """A noticed node's emergency save as the loss records it: its heartbeat's word, once it is the last one (the
    node is gone, so nothing more will come) or the save is over. A node still in its notice (`leaving`) and still
    saving says it later, in its final heartbeat (decide._saved)."""
    if hb is None or not noticed(hb) or not isinstance(hb.emergency, dict):
        return None
    if leaving is not None and hb.emergency.get("state") not in losswords.FINAL:
        return None
    return dict(hb.emergency)


def counted(n: int, what: str) -> str:
    """'1 failure', '4 failures': a count as the messages say it."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def tail_fields(kind: LossKind, hb: Heartbeat | None, counts: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "boot_failure":
        return {"console_tail": counts["console_tail"]}
    if hb is not None and hb.output_tail:
        return {"output_tail": hb.output_tail, "exit_code": hb.exit_code}
    return {}


def give_up(o: Observation, spec: JobSpec, kind: LossKind, cause: str, counts: Mapping[str, Any]
             ) -> tuple[str, dict[str, Any]] | None:
    """The limit this loss goes past, as (the job's FAILED message, the event's details); None: recover."""
    s = o.status
    if kind == "boot_failure" and counts["boot_failures"] >= BOOT_FAILURES_TO_FAIL:
        return (boot_help(spec, s.node, o.settings.boot_grace_seconds),
                {"boot_failures": counts["boot_failures"], "console_tail": counts["console_tail"]})
    if kind in ("failure", "boot_failure") and counts["failures"] > spec.max_failures:
        # The count the status records (this failure included), so the message and `failures` say one number.
        return (f"gave up after {counted(counts['failures'], 'failure')}, more than max_failures "
                f"({spec.max_failures}) (last cause: {cause}); preemptions are not counted",
                {"max_failures": spec.max_failures})
    if kind == "preemption" and spec.max_preemptions is not None and counts["preemptions"] > spec.max_preemptions:
        return (f"gave up after {counted(counts['preemptions'], 'preemption')}, more than max_preemptions "
                f"({spec.max_preemptions}) (last cause: {cause})", {"max_preemptions": spec.max_preemptions})
    rate = spec.preemption_rate
    if kind == "preemption" and rate is not None and rate.action == "fail" and len(counts["preempted_times"]) > rate.max:
        return (f"{len(counts['preempted_times'])} preemptions within {rate.window_hours:g} h, more than "
                f"preemption_rate.max ({rate.max}); action fail", {"preemption_rate": rate.model_dump()})
    return None


def loss_words(s: MemberStatus, *keys: str) -> dict[str, Any]:
    """The loss record's words an alert carries (last_error, emergency), those it holds."""
    return {k: getattr(s, k) for k in keys if getattr(s, k) is not None}
