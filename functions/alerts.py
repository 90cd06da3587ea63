"""Alert messages: the JSON the core publishes to the alerts topic, made here alone from what a decision tells (`told`:
an event and its facts; every message's words are this module's), and its Slack rendering (Block Kit with a
plain-text fallback). Pure: no I/O.

Alert JSON (one object per message; fields beyond these may appear and are shown as-is):
    {"type": "recovered" | "waiting_for_capacity" | "failed" | "invalid_spec" | "succeeded" | "crashed"
             | "boot_failed" | "preemption_rate",
     "severity": "info" | "warning" | "error", "job_id": str, "at": ISO-8601 UTC, "message": str,
     "attempt": int, "restarts": int, "cause": str | null,
     # a loss's alerts (recovered, crashed, boot_failed, preemption_rate, failed): "failures", "preemptions"
     # recovered (sent once every rank steps again, never for a node that did not): "old_zone", "new_zone",
     #   "in_place", the recovery (recovery_time.Recovery.fields: "recovery_seconds", "notice_at", "stepping_at",
     #   "steps_lost", "furthest_step", "resumed_from", "loss_cause": the alert's `cause`), "committed_step" (the step it resumed from),
     #   "stages" (where the recovery's time went: alerts.STAGES → seconds)
     # waiting_for_capacity: "next_attempt_at", "zones"; failed / invalid_spec: "errors" (list[str]) when known
     # succeeded: "committed_step", "zone", the recovery's fields when its last run finished before a recovered was
     #   sent (recovery_time.told); crashed: "exit_code", "output_tail"
     # boot_failed (no agent heartbeat within the boot grace; the node is replaced): "node", "zone", "console_tail"
     # preemption_rate (more than spec.preemption_rate.max in its window): "max", "window_hours", "action"
     # failed with cause setup_failed: "failed_command" (argv), "exit_code", "output_tail"
     # failed with cause no_heartbeat (the second boot in a row without a heartbeat): "console_tail"
     # a failure's (crashed, failed, boot_failed, a recovered after one): "last_error", the last line of the trainer's
     #   (or setup command's) error (respawn.losswords.last_error), shown on a line of its own
     # a noticed node's loss (recovered, succeeded that tells a recovery, preemption_rate, failed): "emergency", how its
     #   emergency save ended ({state, step, reason}), said once in words (respawn.losswords.emergency_sentence)
     # succeeded after a loss whose survivors finished without resuming: "steps_lost" 0 without a recovery time
     # budget (50 %, 80 % of spec.budget.max_usd), budget_exhausted (100 %: stopped BUDGET_EXHAUSTED): "percent",
     #   "budget_usd"
     # every alert of a job whose cost is known (functions/costs.py): "cost_usd", "on_demand_usd", "cost_note"}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

from respawn import losswords, prices
from respawn.schema import MemberStatus

from . import losses, recovery_time

TYPES = ("recovered", "waiting_for_capacity", "failed", "invalid_spec", "succeeded", "crashed", "boot_failed",
         "preemption_rate", "budget", "budget_exhausted", "save_outcome")
_SEVERITY = {"recovered": "info", "succeeded": "info", "waiting_for_capacity": "warning", "crashed": "warning",
             "boot_failed": "warning", "preemption_rate": "warning", "failed": "error", "invalid_spec": "error",
             "budget": "warning", "budget_exhausted": "warning", "save_outcome": "info"}
_ICON = {"info": ":white_check_mark:", "warning": ":warning:", "error": ":x:"}
_TITLE = {"recovered": "recovered", "waiting_for_capacity": "waiting for capacity", "failed": "failed",
          "invalid_spec": "has an invalid spec", "succeeded": "succeeded", "crashed": "trainer crashed, restarting",
          "boot_failed": "had a node that never started its agent; replacing it",
          "preemption_rate": "is preempted more often than its preemption_rate allows",
          "budget": "has spent part of its budget",
          "budget_exhausted": "reached its budget: checkpointed and stopped",
          "save_outcome": "heard how an emergency save ended"}


class BadAlert(ValueError):
    pass


def make(kind: str, job_id: str, at: datetime, message: str, **fields: Any) -> dict[str, Any]:
    """The alert JSON of `kind`, said in `message`; the control plane's alerts are made through `told`."""
    if kind not in TYPES:
        raise ValueError(f"unknown alert type {kind!r}; one of {', '.join(TYPES)}")
    alert = {"type": kind, "severity": _SEVERITY[kind], "job_id": job_id, "at": at.isoformat(), "message": message}
    alert.update({k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in fields.items()})
    return alert


def told(event: str, job_id: str, at: datetime, **facts: Any) -> dict[str, Any]:
    """The alert of what a decision commits: `event` names what happened (one of EVENTS), `facts` are its data (the
    numbers, node, zone, cause, exit code; the status it is told from). Its type, message and fields are made here
    alone, never where the decision is (tests/test_alert_words.py). The only words a fact carries are the status
    message's, written once where the status is made: `said`, the whole message, which an alert of an end or a wait
    repeats; `why` and `words`, the part of it an alert quotes."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; one of {', '.join(EVENTS)}")
    kind, message, fields = EVENTS[event](**facts)
    return make(kind, job_id, at, message, **fields)


Told = tuple[str, str, dict[str, Any]]  # an event's alert: (type, message, fields)


def _repeating(kind: str, **fixed: Any) -> Callable[..., Told]:
    """An alert whose message is the committed status's (`said`)."""
    return lambda said, **fields: (kind, said, {**fixed, **fields})


def _save_outcome(node: str, **fields: Any) -> Told:
    return ("save_outcome", f"{node} said how its emergency save ended after its loss was recorded",
            {"node": node, **fields})


def _succeeded(s: MemberStatus, committed_step: int | None, recovery: dict[str, Any], words: str,
               every_node: bool = False) -> Told:
    """`recovery`: what the end tells of the recovery under way (decide.ended_recovery), with the save of its loss;
    `words`: what its status message says of it."""
    ended = "trainer exited 0 on every node; nodes deleted" if every_node else "trainer exited 0; node deleted"
    return "succeeded", ended + words, {"zone": s.zone, "restarts": s.restarts, "attempt": s.attempt,
                                        "committed_step": committed_step, **recovery,
                                        **(losses.loss_words(s, "emergency") if recovery else {})}


def _recovery(s: MemberStatus, back: recovery_time.Recovery) -> dict[str, Any]:
    """A recovered alert's fields: where from and to, the counts, the recovery, the loss's words."""
    return {"old_zone": s.preempted_zone, "new_zone": s.zone, "committed_step": back.resumed_from,
            "restarts": s.restarts, "failures": s.failures, "preemptions": s.preemptions, "attempt": s.attempt,
            "cause": s.last_cause, **back.fields(), **losses.loss_words(s, "last_error", "emergency")}


def _recovered(s: MemberStatus, back: recovery_time.Recovery, stages: dict[str, float]) -> Told:
    """One node trains again (decide._healthy); `stages`: where the recovery's time went."""
    where = f"training again on {s.node} in {s.zone}"
    if stages:
        where += f"; {breakdown_text(s.last_cause, stages, back.seconds)}"
    return "recovered", where, {"stages": stages, **_recovery(s, back),
                                "in_place": s.in_place_restarts > 0 and s.preempted_zone == s.zone}


def _generation_recovered(s: MemberStatus, back: recovery_time.Recovery, generation: int, world_size: int,
                          nodes: int) -> Told:
    """A job of several nodes trains again, `world_size` of its `nodes`, in `generation`."""
    on = f"{world_size} of {nodes} nodes" if world_size < nodes else f"all {nodes} nodes"
    return ("recovered", f"training again on {on} in {s.zone} (generation {generation}); "
            + breakdown_text(back.cause, {}, back.seconds), _recovery(s, back))


def _crashed(node: str, exit_code: int | None, **fields: Any) -> Told:
    return "crashed", f"trainer exited {exit_code} on {node}; restarting", {"exit_code": exit_code, **fields}


def _generation_crashed(generation: int, why: str, **fields: Any) -> Told:
    return "crashed", f"{why} in generation {generation}; restarting it on every node", fields


def _boot_failed(node: str, boot_grace_seconds: float, **fields: Any) -> Told:
    return ("boot_failed", f"no agent heartbeat from {node} within {int(boot_grace_seconds)} s of its boot; replacing "
            "it (a second such boot ends the job)", {"node": node, **fields})


def _preemption_rate(in_window: int, delay: float, **fields: Any) -> Told:
    """`in_window`: the preemptions within the rate's window; `delay`: the backoff it sets (its action's)."""
    what = f"waiting {int(delay)} s before the next node" if fields["action"] == "backoff" else "recovering as usual"
    return ("preemption_rate", f"{in_window} preemptions within {fields['window_hours']:g} h (more than "
            f"{fields['max']}); {what}", fields)


def _budget(spent_usd: float, **fields: Any) -> Told:
    return ("budget", f"{prices.usd(spent_usd)} spent: {fields['percent']} % of the budget of "
            f"{prices.usd(fields['budget_usd'])}; at 100 % the job is checkpointed and stopped", fields)


# What a decision tells (told's `event`) → its alert.
EVENTS: dict[str, Callable[..., Told]] = {
    "failed": _repeating("failed"), "invalid_spec": _repeating("invalid_spec"),
    "waiting_for_capacity": _repeating("waiting_for_capacity"),
    "budget_exhausted": _repeating("budget_exhausted", percent=100), "budget": _budget,
    "save_outcome": _save_outcome, "succeeded": _succeeded, "recovered": _recovered,
    "generation_recovered": _generation_recovered, "crashed": _crashed, "generation_crashed": _generation_crashed,
    "boot_failed": _boot_failed, "preemption_rate": _preemption_rate}


# A recovery's stages (decide.recovery_stages), as the recovered alert names them.
STAGES = recovery_time.STAGES


def breakdown_text(cause: str | None, stages: dict[str, float], seconds: float) -> str:
    """'this preemption cost 250.3 s: 52.0 s waiting for capacity, …': the recovery's time and every part of it
    (recovery_time.breakdown)."""
    return recovery_time.breakdown(cause, stages, seconds)


def _losses(alert: dict[str, Any]) -> list[tuple[str, str]]:
    """Failures and preemptions, when the alert counts them (older alerts carry restarts alone)."""
    return [(name, str(alert[key])) for name, key in (("Failures", "failures"), ("Preemptions", "preemptions"))
            if alert.get(key) is not None]


def _facts(alert: dict[str, Any]) -> list[tuple[str, str]]:
    kind = alert["type"]
    facts: list[tuple[str, str]] = []
    if kind == "recovered":
        move = f"{alert.get('old_zone') or '?'} → {alert.get('new_zone') or '?'}"
        if alert.get("in_place"):
            move += " (restarted in place)"
        facts += [("Zone", move), ("Recovery time", recovery_time.text(alert.get("recovery_seconds"))),
                  ("Steps lost", "unknown" if alert.get("steps_lost") is None else str(alert["steps_lost"])),
                  ("Restarts", str(alert.get("restarts", "?"))), *_losses(alert)]
        if alert.get("cause"):
            facts.append(("Cause", str(alert["cause"])))
    elif kind == "waiting_for_capacity":
        facts += [("Zones", ", ".join(alert.get("zones") or []) or "?"), ("Next try", str(alert.get("next_attempt_at", "?")))]
    elif kind == "succeeded":
        facts += [("Zone", str(alert.get("zone") or "?")), ("Restarts", str(alert.get("restarts", 0)))]
        if alert.get("committed_step") is not None:
            facts.append(("Committed step", str(alert["committed_step"])))
        if "recovery_seconds" in alert:  # its last run stepped and finished before a `recovered` was sent
            facts += [("Recovery time", recovery_time.text(alert["recovery_seconds"])),
                      ("Steps lost", "unknown" if alert.get("steps_lost") is None else str(alert["steps_lost"]))]
        elif alert.get("steps_lost") is not None:  # it finished without resuming after its last loss
            facts.append(("Steps lost", str(alert["steps_lost"])))
    elif kind == "crashed":
        facts += [("Exit code", str(alert.get("exit_code"))), ("Restarts", str(alert.get("restarts", "?"))),
                  *_losses(alert)]
    elif kind == "boot_failed":
        facts += [("Node", f"{alert.get('node') or '?'} in {alert.get('zone') or '?'}"), *_losses(alert)]
    elif kind == "preemption_rate":
        facts += [("Limit", f"{alert.get('max', '?')} in {alert.get('window_hours', '?')} h"),
                  ("Action", str(alert.get("action", "?"))), *_losses(alert)]
    elif kind == "failed":
        facts += [("Restarts", str(alert.get("restarts", "?"))), *_losses(alert)]
        if alert.get("cause"):
            facts.append(("Cause", str(alert["cause"])))
        if alert.get("failed_command"):
            facts.append(("Command", " ".join(map(str, alert["failed_command"]))))
    elif kind == "save_outcome":
        facts.append(("Node", f"{alert.get('node') or '?'} in {alert.get('zone') or '?'}"))
    elif kind in ("budget", "budget_exhausted"):
        cap = alert.get("budget_usd")
        facts.append(("Budget", f"{alert.get('percent', '?')} % of "
                                f"{prices.usd(cap) if isinstance(cap, (int, float)) else '?'}"))
    if isinstance(alert.get("cost_usd"), (int, float)):
        facts.append(("Cost so far", cost_text(alert["cost_usd"], alert.get("on_demand_usd"))))
    return facts


def cost_text(usd: float, on_demand_usd: float | None) -> str:
    """'$1.23 (on demand: $3.45)': a job's cost so far against the same lives on demand."""
    return prices.usd(usd) + (f" (on demand: {prices.usd(on_demand_usd)})" if isinstance(on_demand_usd, (int, float))
                              else "")


def _said(alert: dict[str, Any]) -> list[str]:
    """The loss's own lines: the trainer's last error, and how the emergency save ended (in words, once)."""
    lines = []
    if alert.get("last_error"):
        lines.append(f"last error: {alert['last_error']}")
    saved = losswords.emergency_sentence(alert.get("emergency"), alert.get("resumed_from"), alert.get("steps_lost"))
    if saved:
        lines.append(saved)
    return lines


def to_slack(alert: Any) -> dict[str, Any]:
    """Alert JSON → Slack webhook payload {"text": fallback, "blocks": [...]}; BadAlert if it is not an alert."""
    if not isinstance(alert, dict) or not isinstance(alert.get("type"), str) or not isinstance(alert.get("job_id"), str):
        raise BadAlert("an alert is a JSON object with string fields 'type' and 'job_id'")
    kind = alert["type"]
    severity = alert.get("severity") or _SEVERITY.get(kind, "info")
    title = f"Job *{alert['job_id']}* {_TITLE.get(kind, kind)}"
    message = str(alert.get("message") or "")
    facts = _facts(alert)
    said = _said(alert)
    text = title.replace("*", "") + (f": {message}" if message else "")
    text += "".join(f"; {line}" for line in said)
    if facts:
        text += " (" + "; ".join(f"{k.lower()}: {v}" for k, v in facts) + ")"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"{_ICON.get(severity, '')} {title}".strip()}}
    ]
    if message:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": message[:2900]}})
    for line in said:  # each its own line, under the message
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": line[:2900]}})
    if facts:
        blocks.append({"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in facts[:10]]})
    for key, label in (("output_tail", ""), ("console_tail", "Serial console (end):\n")):
        tail = alert.get(key) or ""
        if tail:
            blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                       "text": label + "```" + str(tail)[-2800:] + "```"}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"Respawn · {alert.get('at', '')}"}]})
    return {"text": text, "blocks": blocks}
