"""Alert messages: the JSON the core publishes to the alerts topic, and its Slack rendering (Block Kit with a
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
from typing import Any

from respawn import losswords, prices

from . import recovery_time

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
    if kind not in TYPES:
        raise ValueError(f"unknown alert type {kind!r}; one of {', '.join(TYPES)}")
    alert = {"type": kind, "severity": _SEVERITY[kind], "job_id": job_id, "at": at.isoformat(), "message": message}
    alert.update({k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in fields.items()})
    return alert


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
