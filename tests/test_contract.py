"""The node contract (respawn.contract): one writer and validator for the node settings, and every name of the
contract defined once in the installable code."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fixtures import node_image_python
from respawn import contract
from respawn.contract import NodeSettings, SettingsError
from respawn.control import nodespec
from respawn.schema import parse_spec

ROOT = Path(__file__).resolve().parent.parent
INSTALLED_FOLDERS = ("respawn", "functions", "node_agent", "trainer")


def test_what_the_control_plane_writes_the_agent_reads_back():
    spec = parse_spec({"id": "llm", "zones": ["us-central1-a"], "checkpoint_uri": "gs://ckpt-bucket/llm",
                       "accelerator": {"kind": "gpu", "machine_type": "g2-standard-4"},
                       "trainer": {"command": ["python", "train.py", "--lr", "0.1"], "env": {"SEED": "1"}}})
    settings = NodeSettings.from_json(nodespec.settings_json(spec))
    assert settings.command == ("python", "train.py", "--lr", "0.1") and settings.env == {"SEED": "1"}
    assert settings.checkpoint_uri == "gs://ckpt-bucket/llm"
    assert settings.heartbeat_seconds == contract.DEFAULT_HEARTBEAT_SECONDS
    assert settings.notice_budget_seconds == contract.DEFAULT_NOTICE_BUDGET_SECONDS
    assert settings.sweep_topic == "respawn-sweep"  # the deployed topic, where on_sweep listens
    assert contract.topic_path("p", settings.sweep_topic) == "projects/p/topics/respawn-sweep"
    assert NodeSettings.from_json(settings.to_json()) == settings


def test_unknown_keys_are_ignored_and_defaults_apply():
    s = NodeSettings.from_json(json.dumps({"command": ["x"], "checkpoint_uri": "file:///c", "from_the_future": 1}))
    assert s == NodeSettings(command=("x",), checkpoint_uri="file:///c")
    assert s.metadata_wait_seconds == contract.DEFAULT_METADATA_WAIT_SECONDS


@pytest.mark.parametrize("fields, words", [
    ({"command": ["x"]}, "checkpoint_uri is missing"),
    ({"checkpoint_uri": "gs://b"}, "command is missing"),
    ({"command": ["x"], "checkpoint_uri": "gs://b", "heartbeat_seconds": float("inf")}, "heartbeat_seconds"),
    ({"command": ["x", ""], "checkpoint_uri": "gs://b"}, "argv list"),
    ({"command": ["x"], "checkpoint_uri": "gs://b", "sweep_topic": "projects/p/sweep"}, "sweep_topic"),
    ({"command": ["x"], "checkpoint_uri": "gs://b", "sweep_topic": ""}, "sweep_topic"),
])
def test_invalid_settings_name_the_key(fields, words):
    with pytest.raises(SettingsError, match=words):
        NodeSettings.from_json(json.dumps(fields))
    if "command" in fields and "checkpoint_uri" in fields:  # construction validates the same way as parsing
        with pytest.raises(SettingsError, match=words):
            NodeSettings(**fields)


def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_every_contract_name_is_defined_once():
    names = {getattr(contract, n) for n in dir(contract) if n.startswith(("ATTR_", "ENV_", "LABEL_"))}
    assert len(names) > 12
    owners: dict[str, list[str]] = {}
    for folder in INSTALLED_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "contract.py":
                continue
            for value in _string_constants(path) & names:
                owners.setdefault(value, []).append(str(path.relative_to(ROOT)))
    assert not owners, f"contract names written out again outside respawn/contract.py: {owners}"


def test_contract_imports_only_the_standard_library_and_runs_on_the_oldest_node_python():
    imported = set()
    for node in ast.walk(ast.parse((ROOT / "respawn" / "contract.py").read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    py39 = node_image_python("3.9")  # the Debian 11 Deep Learning VM image's Python
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import contract as c; "
            "print(c.NodeSettings.from_json(c.NodeSettings(command=['p'], checkpoint_uri='gs://b').to_json())); "
            "assert c.node_name('j', 2) == 'j-2' and c.NodeState('exited') is c.NodeState.EXITED; "
            "assert c.HEARTBEAT_FIELDS[0] == 'job_id' and c.HEARTBEAT_FIELDS[-1] == 'heartbeat_at'")
    out = subprocess.run([py39, "-I", "-c", code, str(ROOT / "respawn")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_node_settings_name_a_heartbeat_database_or_leave_it_to_the_default():
    base = {"command": ["python", "t.py"], "checkpoint_uri": "gs://b/j"}
    assert NodeSettings(**base).heartbeat_database is None  # the agent writes to NODES_DATABASE
    named = NodeSettings(**base, heartbeat_database="respawn-nodes-3")
    assert NodeSettings.from_json(named.to_json()).heartbeat_database == "respawn-nodes-3"
    for bad in ("(default)", "Respawn", "x", "respawn-nodes-", "a/b"):
        with pytest.raises(SettingsError, match="heartbeat_database must be a Firestore database id"):
            NodeSettings(**base, heartbeat_database=bad)
