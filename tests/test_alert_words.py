"""Every alert is made from what a decision tells in one place, functions/alerts.py's `told` (issue #49 item 1): no
other module of the control plane composes an alert, and an event's facts give its message and fields. Pure."""

from __future__ import annotations

import ast
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from respawn.control import alerts, recovery_time
from tests.deploy_fixtures import ROOT

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)


def _composes_an_alert(path) -> list[int]:
    """The lines of `path` that call alerts.make, import it, or write an alert's `severity` by hand."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and node.attr == "make" and getattr(node.value, "id", None) == "alerts"
                or isinstance(node, ast.ImportFrom) and (node.module or "").endswith("alerts")
                and any(a.name == "make" for a in node.names)
                or isinstance(node, ast.Constant) and node.value == "severity"):
            lines.append(node.lineno)
    return lines


def test_no_module_but_alerts_composes_an_alert():
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "functions").rglob("*.py"))
             if p.name != "alerts.py" and (lines := _composes_an_alert(p))}
    assert not found, f"alerts are made by alerts.told alone, from an event and its facts; composed at {found}"


def test_a_crash_names_the_node_in_its_words_and_keeps_its_exit_code_and_counts():
    a = alerts.told("crashed", "j", NOW, node="j-3", exit_code=2, output_tail="Traceback", restarts=4, failures=1)
    assert a == {"type": "crashed", "severity": "warning", "job_id": "j", "at": NOW.isoformat(),
                 "message": "trainer exited 2 on j-3; restarting", "exit_code": 2, "output_tail": "Traceback",
                 "restarts": 4, "failures": 1}


@pytest.mark.parametrize("action, what", [("backoff", "waiting 120 s before the next node"),
                                          ("alert", "recovering as usual")])
def test_a_preemption_rate_says_its_count_limit_and_action(action, what):
    a = alerts.told("preemption_rate", "j", NOW, in_window=7, delay=120.0, window_hours=24.0, max=6, action=action)
    assert a["message"] == f"7 preemptions within 24 h (more than 6); {what}"
    assert {k: a[k] for k in ("window_hours", "max", "action")} == {"window_hours": 24.0, "max": 6, "action": action}
    assert "in_window" not in a and "delay" not in a


def test_a_boot_failure_and_a_budget_are_told_in_their_words():
    boot = alerts.told("boot_failed", "j", NOW, node="j-2", zone="z", boot_grace_seconds=900.0, console_tail="..")
    assert boot["message"] == ("no agent heartbeat from j-2 within 900 s of its boot; replacing it (a second such "
                               "boot ends the job)") and boot["node"] == "j-2" and "boot_grace_seconds" not in boot
    budget = alerts.told("budget", "j", NOW, spent_usd=50.0, percent=50, budget_usd=100.0)
    assert budget["message"] == ("$50.00 spent: 50 % of the budget of $100.00; at 100 % the job is checkpointed and "
                                 "stopped")
    assert (budget["percent"], budget["budget_usd"]) == (50, 100.0) and "spent_usd" not in budget


def test_an_end_repeats_its_status_message():
    a = alerts.told("budget_exhausted", "j", NOW, said="budget exhausted: …", budget_usd=10.0)
    assert (a["type"], a["message"], a["percent"], a["budget_usd"]) == ("budget_exhausted", "budget exhausted: …",
                                                                        100, 10.0)


def test_a_generation_recovered_says_how_many_nodes_and_what_the_recovery_cost():
    s = SimpleNamespace(zone="us-central1-b", preempted_zone="us-central1-a", restarts=2, failures=0, preemptions=2,
                        attempt=5, last_cause="preempted", last_error=None, emergency=None)
    back = recovery_time.Recovery("preempted", NOW - timedelta(seconds=90), NOW, 120, 100)
    a = alerts.told("generation_recovered", "j", NOW, s=s, back=back, generation=3, world_size=3, nodes=4)
    assert a["message"] == ("training again on 3 of 4 nodes in us-central1-b (generation 3); this preemption cost "
                            "90.0 s")
    assert (a["old_zone"], a["new_zone"], a["committed_step"], a["steps_lost"]) == ("us-central1-a", "us-central1-b",
                                                                                     100, 20)


def test_an_unknown_event_is_refused():
    with pytest.raises(ValueError, match="unknown event"):
        alerts.told("exploded", "j", NOW)
