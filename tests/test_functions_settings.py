"""respawn.control.settings: the control plane's configuration read from the environment in one place, validated,
documented in functions/README.md, and passed down by Deps.default() (re-read on every call)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from respawn.control import settings as cs
from respawn.control.settings import ControlSettings, NodeOptions, SettingsError

ROOT = Path(__file__).resolve().parent.parent
# What deploy/render.py puts in RESPAWN_AGENT and RESPAWN_LIBRARY (respawn.deployment.release_artifact).
AGENT = f"gs://b/respawn/releases/1/respawn-agent-0.1.0.pyz#sha256={'a' * 64}"
LIBRARY = f"gs://b/respawn/releases/1/respawn-0.1.0-py3-none-any.whl#sha256={'b' * 64}"


def test_unset_means_the_documented_defaults():
    s = ControlSettings.from_env({})
    assert s == ControlSettings()
    assert (s.stale_heartbeat_seconds, s.boot_grace_seconds, s.backoff_base_seconds, s.max_in_place_restarts) == (
        120, 900, 30, 1)
    assert (s.poll_seconds, s.poll_budget_seconds, s.compute_op_timeout_seconds, s.tpu_op_timeout_seconds) == (
        5, 120, 300, 600)
    assert (s.slack_attempts, s.slack_backoff_seconds, s.alert_publish_timeout_seconds) == (4, 1, 10)
    assert (s.project, s.compute_endpoint, s.tpu_endpoint, s.alerts_topic, s.slack_webhook_url) == (None,) * 5
    assert (s.sweep_topic, s.sweep_publish_timeout_seconds) == ("respawn-sweep", 60)  # the deployed topic's name
    assert s.nodes == NodeOptions((), None, None, True, None, None, 15.0, 25.0, "respawn-sweep")
    # Empty is unset, as before.
    assert ControlSettings.from_env({name: "" for name in _names()}) == s


def test_every_variable_reaches_its_field():
    env = {
        "RESPAWN_PROJECT": "p", "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:1", "RESPAWN_TPU_ENDPOINT": "http://127.0.0.1:2",
        "RESPAWN_ALERTS_TOPIC": "alerts", "RESPAWN_ALERT_PUBLISH_TIMEOUT_SECONDS": "3", "SLACK_WEBHOOK_URL": "https://hook",
        "RESPAWN_SLACK_ATTEMPTS": "2", "RESPAWN_SLACK_BACKOFF_SECONDS": "0.5", "RESPAWN_STALE_HEARTBEAT_SECONDS": "60",
        "RESPAWN_BOOT_GRACE_SECONDS": "30", "RESPAWN_BACKOFF_BASE_SECONDS": "2", "RESPAWN_MAX_IN_PLACE_RESTARTS": "0",
        "RESPAWN_POLL_SECONDS": "0.05", "RESPAWN_POLL_BUDGET_SECONDS": "15", "RESPAWN_OP_TIMEOUT_SECONDS": "60",
        "RESPAWN_NODE_IDENTITIES": "n-1@p.iam.gserviceaccount.com,n-2@p.iam.gserviceaccount.com",
        "RESPAWN_STORAGE_ENDPOINT": "http://127.0.0.1:3", "RESPAWN_MONITORING_ENDPOINT": "http://127.0.0.1:4",
        "RESPAWN_NETWORK": "net",
        "RESPAWN_SUBNETWORK": "sub", "RESPAWN_EXTERNAL_IP": "0", "RESPAWN_AGENT": AGENT, "RESPAWN_LIBRARY": LIBRARY,
        "RESPAWN_HEARTBEAT_SECONDS": "5", "RESPAWN_NOTICE_BUDGET_SECONDS": "20",
        "RESPAWN_SWEEP_TOPIC": "projects/p/topics/sweep", "RESPAWN_SWEEP_PUBLISH_TIMEOUT_SECONDS": "7",
        "RESPAWN_PROGRESS_TIMEOUT_SECONDS": "90", "RESPAWN_BILLING_ENDPOINT": "http://127.0.0.1:5",
        "RESPAWN_BILLING_API_KEY": "k", "RESPAWN_BUDGET_LOOKAHEAD_SECONDS": "12",
    }
    assert set(env) | {"GOOGLE_CLOUD_PROJECT", "GCP_PROJECT"} == set(_names())
    s = ControlSettings.from_env(env)
    assert s == ControlSettings(
        project="p", compute_endpoint="http://127.0.0.1:1", tpu_endpoint="http://127.0.0.1:2", alerts_topic="alerts",
        alert_publish_timeout_seconds=3, slack_webhook_url="https://hook", slack_attempts=2, slack_backoff_seconds=0.5,
        stale_heartbeat_seconds=60, boot_grace_seconds=30, backoff_base_seconds=2, max_in_place_restarts=0,
        poll_seconds=0.05, poll_budget_seconds=15, compute_op_timeout_seconds=60, tpu_op_timeout_seconds=60,
        progress_timeout_seconds=90, sweep_topic="projects/p/topics/sweep", sweep_publish_timeout_seconds=7,
        storage_endpoint="http://127.0.0.1:3", monitoring_endpoint="http://127.0.0.1:4",
        billing_endpoint="http://127.0.0.1:5", billing_api_key="k", budget_lookahead_seconds=12,
        nodes=NodeOptions(("n-1@p.iam.gserviceaccount.com", "n-2@p.iam.gserviceaccount.com"), "net", "sub", False,
                          AGENT, LIBRARY, 5, 20,
                          "projects/p/topics/sweep"))  # the nodes nudge the controller where its sweep listens
    assert "https://hook" not in repr(s) and "'k'" not in repr(s)  # the webhook URL and the API key are secrets
    # Goodput goes to Cloud Monitoring in production; a local run (the sim's Compute) only where it names one.
    assert s.writes_goodput and ControlSettings().writes_goodput
    assert not ControlSettings(compute_endpoint="http://127.0.0.1:1").writes_goodput
    assert ControlSettings.from_env({"GOOGLE_CLOUD_PROJECT": "g", "GCP_PROJECT": "x"}).project == "g"
    assert ControlSettings.from_env({"RESPAWN_PROJECT": "r", "GOOGLE_CLOUD_PROJECT": "g"}).project == "r"


@pytest.mark.parametrize("name,value", [
    ("RESPAWN_STALE_HEARTBEAT_SECONDS", "two minutes"), ("RESPAWN_POLL_SECONDS", "0"), ("RESPAWN_BOOT_GRACE_SECONDS", "-1"),
    ("RESPAWN_OP_TIMEOUT_SECONDS", "inf"), ("RESPAWN_MAX_IN_PLACE_RESTARTS", "1.5"), ("RESPAWN_SLACK_ATTEMPTS", "0"),
    ("RESPAWN_EXTERNAL_IP", "maybe"), ("RESPAWN_HEARTBEAT_SECONDS", "nan"), ("RESPAWN_ALERT_PUBLISH_TIMEOUT_SECONDS", "x"),
    ("RESPAWN_SWEEP_PUBLISH_TIMEOUT_SECONDS", "0"), ("RESPAWN_NODE_IDENTITIES", "a@p.iam.gserviceaccount.com,,"),
    ("RESPAWN_NODE_IDENTITIES", "a@p.iam.gserviceaccount.com,a@p.iam.gserviceaccount.com"),
])
def test_a_bad_value_names_its_variable(name, value):
    with pytest.raises(SettingsError, match=re.escape(f"{name}={value!r}")):
        ControlSettings.from_env({name: value})


def test_the_project_is_required_only_where_google_cloud_is_reached():
    with pytest.raises(SettingsError, match="RESPAWN_PROJECT"):
        ControlSettings.from_env({}).require_project()
    assert ControlSettings.from_env({"RESPAWN_PROJECT": "p"}).require_project() == "p"


def test_nothing_else_in_the_control_plane_reads_the_environment():
    readers = []
    for path in sorted((ROOT / "functions").rglob("*.py")):
        if path.name == "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert readers == []


def test_the_readme_documents_every_variable():
    text = (ROOT / "functions" / "README.md").read_text()
    section = text[text.index("## Environment"):]
    section = section[:section.index("\n## ", 1)]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", section))
    assert set(_names()) <= documented, set(_names()) - documented


def test_deps_default_reads_the_environment_on_every_call(monkeypatch):
    from respawn.control.reconcile import Deps

    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")  # a client is built, nothing is called
    monkeypatch.setenv("RESPAWN_PROJECT", "p")
    monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("RESPAWN_TPU_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("RESPAWN_STALE_HEARTBEAT_SECONDS", "7")
    monkeypatch.setenv("RESPAWN_OP_TIMEOUT_SECONDS", "33")
    monkeypatch.setenv("RESPAWN_AGENT", AGENT)
    monkeypatch.setenv("RESPAWN_LIBRARY", LIBRARY)
    deps = Deps.default()
    assert deps.project == "p" and deps.config.settings.stale_heartbeat_seconds == 7
    assert deps.providers["gpu"].op_timeout == deps.providers["tpu"].op_timeout == 33
    assert (deps.providers["gpu"].nodes.agent, deps.providers["tpu"].nodes.library) == (AGENT, LIBRARY)
    monkeypatch.setenv("RESPAWN_POLL_BUDGET_SECONDS", "9")
    assert Deps.default().config.poll_budget_seconds == 9
    monkeypatch.setenv("RESPAWN_POLL_BUDGET_SECONDS", "soon")
    with pytest.raises(SettingsError, match="RESPAWN_POLL_BUDGET_SECONDS"):
        Deps.default()


def _names() -> list[str]:
    names = [v for k, v in vars(cs).items() if k.isupper() and isinstance(v, str) and v.isupper() and "_" in v]
    return names + list(cs.PROJECT_VARS)
