"""Least privilege: every API method the code calls is granted, and nothing is granted that no code calls.

The calls are read from the source itself: the controller's adapters (functions/adapters/*.py) through the
respawn.control.clients factory (`clients.instances().insert_unary(...)`, `ops = clients.zone_operations(); ops.get`) and
the Firestore client's methods; the node's REST commit (node_agent/) and the trainer's Cloud Storage calls."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from deploy import iam
from respawn import deployment, selftest
from respawn.contract import NODES_DATABASE
from respawn.app.workdir import GCS_PREFIX as WORKDIRS_PREFIX
from tests.deploy_fixtures import ROOT

CALLS = iam.load()["calls"]
FACTORIES = {key.split(".")[0] for key in CALLS["controller"]}


def _factory_call(node: ast.AST) -> str | None:
    """`X.clients.instances()` / `clients.tpu()` → the factory name."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES:
        return node.func.attr
    return None


def controller_calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}  # local name -> factory, for `ops = self.clients.zone_operations()`
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            factory = _factory_call(node.value)
            if factory:
                aliases[node.targets[0].id] = factory
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        factory = _factory_call(node.value)
        if factory is None and isinstance(node.value, ast.Name):
            factory = aliases.get(node.value.id)
        if factory:
            key = f"{factory}.{node.attr}"
            assert key in CALLS["controller"], (
                f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} calls {key}: add it to deploy/iam/permissions.yaml `calls.controller` with "
                "the API methods it makes, and grant their permissions")
            found.add(key)
    if "google.cloud import firestore" in path.read_text() or "google.cloud.firestore" in path.read_text():
        names = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "transactional"}
        if "transactional" in names:
            names.add("transaction")
        found |= {f"firestore:{m}" for m in names if m in CALLS["firestore"]}
    return found


def _methods(keys: set[str]) -> set[str]:
    out = set()
    for key in keys:
        if key.startswith("firestore:"):
            out.update(CALLS["firestore"][key.split(":", 1)[1]])
        else:
            out.update(CALLS["controller"][key])
    return out


def called_by_controller() -> set[str]:
    keys = set()
    for path in sorted((ROOT / "functions" / "adapters").glob("*.py")):
        keys |= controller_calls(path)
    return _methods(keys)


def called_by_node() -> set[str]:
    methods = set(CALLS["node"]["guest-logging-agent"])  # the node's journal shipped by the guest logging agent
    agent = "\n".join(p.read_text() for p in sorted((ROOT / "node_agent").glob("*.py")))
    for rest in ("documents:commit", "?mask.fieldPaths=", ":publish", "oauth2accesstoken"):
        if rest in agent:
            methods.update(CALLS["node"][rest])
    storage = (ROOT / "trainer" / "storage.py").read_text()
    for name, api in CALLS["node"].items():
        if ":" not in name and name != "guest-logging-agent" and re.search(rf"\.{re.escape(name)}\(", storage):
            methods.update(api)
    return methods


def test_the_scan_sees_the_contract_calls():
    # If the adapters stop going through the factory, the scan would see nothing and prove nothing.
    called = called_by_controller()
    assert {"compute.instances.insert", "compute.instances.get", "tpu.nodes.create", "pubsub.topics.publish",
            "firestore.documents.runQuery"} <= called, called


def test_controller_holds_exactly_what_the_adapters_call():
    called, granted = called_by_controller(), iam.granted_methods("controller")
    assert called - granted == set(), f"called but not granted (deploy/iam/permissions.yaml): {sorted(called - granted)}"
    assert granted - called == set(), f"granted but no adapter calls them: {sorted(granted - called)}"


def test_node_holds_exactly_what_the_agent_and_trainer_call():
    called, granted = called_by_node(), iam.granted_methods("node")
    assert called - granted == set(), f"called but not granted: {sorted(called - granted)}"
    assert granted - called == set(), f"granted but unused: {sorted(granted - called)}"


def test_every_node_call_listed_is_made():
    # A REST path listed for the node that the agent no longer calls is a stale grant waiting to happen.
    agent = "\n".join(p.read_text() for p in sorted((ROOT / "node_agent").glob("*.py")))
    listed = [name for name in CALLS["node"] if ":" in name or "?" in name]
    assert listed and [name for name in listed if name not in agent] == []


def test_the_node_may_publish_to_the_sweep_topic_only():
    # The agent wakes the controller through the sweep topic (node_agent/nudge.py); nothing else it may publish to.
    assert "pubsub.topics.publish" in called_by_node()
    node_pubsub = [r for r in iam.roles() if r.member == "node" and any(p.startswith("pubsub.") for p in r.permissions)]
    assert [(r.scope, r.permissions) for r in node_pubsub] == [("sweep-topic", ["pubsub.topics.publish"])]


def test_the_notifier_answers_the_self_test_only_and_the_trigger_holds_nothing():
    assert not iam.granted_methods("trigger")
    assert iam.granted_methods("notifier") == {"firestore.documents.commit.set"}
    for permission in ("datastore.entities.create", "datastore.entities.update"):
        assert POLICY.may("notifier", permission, f"{DATABASE}{selftest.DATABASE}")
        assert not POLICY.may("notifier", permission, f"{DATABASE}(default)")  # no job state
        assert not POLICY.may("notifier", permission, f"{DATABASE}{NODES_DATABASE}")
        assert POLICY.may("controller", permission, f"{DATABASE}{selftest.DATABASE}")  # on_sweep's, on_log_event's


def test_acting_as_the_node_is_granted_on_the_node_account_only():
    for role in iam.roles():
        if "iam.serviceAccounts.actAs" in role.permissions:
            assert role.scope == "node-service-account" and role.permissions == ["iam.serviceAccounts.actAs"]
        if any(p.startswith("storage.") for p in role.permissions):
            assert role.scope in ("checkpoint-bucket", "job-folder")
        if any(p.startswith("pubsub.") for p in role.permissions):
            assert role.scope in ("alerts-topic", "sweep-topic")


def test_every_method_grants_something_and_roles_are_well_formed():
    data = iam.load()
    for role in iam.roles(data):
        assert role.member in ("controller", "notifier", "trigger", "node")
        assert re.fullmatch(r"[a-zA-Z0-9_.]{3,64}", role.id), role.id
        for method, perms in role.methods.items():
            assert perms, f"{role.id}: {method} grants nothing"
            for p in perms:
                assert re.fullmatch(r"[a-z]+\.[a-zA-Z]+\.[a-zA-Z]+", p), f"{role.id}: {p!r} is not a permission name"
    for p in data["predefined"]:
        assert p["role"].startswith("roles/") and p["why"]


# Firestore's table of required permissions per API method (https://cloud.google.com/firestore/docs/security/iam,
# "Required permissions"), for the methods the code maps its calls to.
FIRESTORE_REQUIRED = {
    "firestore.documents.batchGet": {"datastore.entities.get"},
    "firestore.documents.get": {"datastore.entities.get"},
    "firestore.documents.runQuery": {"datastore.entities.get", "datastore.entities.list"},
    "firestore.documents.list": {"datastore.entities.get", "datastore.entities.list"},
    "firestore.documents.beginTransaction": {"datastore.databases.get"},
    "firestore.documents.rollback": {"datastore.databases.get"},
    "firestore.documents.commit.set": {"datastore.entities.create", "datastore.entities.update"},  # no precondition
    "firestore.documents.commit.create": {"datastore.entities.create"},  # exists=false
    "firestore.documents.commit.update": {"datastore.entities.update"},  # exists=true
    "firestore.documents.commit.delete": {"datastore.entities.delete"},
}


def test_firestore_methods_grant_what_firestore_requires():
    mapped = {m for calls in CALLS.values() for api in calls.values() for m in api if m.startswith("firestore.")}
    assert mapped <= set(FIRESTORE_REQUIRED), sorted(mapped - set(FIRESTORE_REQUIRED))
    granted = [(role.id, method, set(perms)) for role in iam.roles() for method, perms in role.methods.items()
               if method.startswith("firestore.")]
    assert any(method == "firestore.documents.runQuery" for _, method, _ in granted)
    for role_id, method, perms in granted:
        assert perms == FIRESTORE_REQUIRED[method], f"{role_id}: {method} grants {sorted(perms)}"


def test_scan_finds_a_new_unlisted_call(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f(self):\n    self.clients.instances().set_labels(project='p')\n")
    try:
        controller_calls(bad)
    except AssertionError as exc:
        assert "instances.set_labels" in str(exc)
    else:
        raise AssertionError("an unlisted client call must fail the scan")


# ---- what a node's identity can and cannot reach, computed from the bindings the build makes and the folder grant the
# controller makes (deploy.iam.Policy): the emulators enforce no IAM, so the policy is tested as data. Two jobs run:
# job A holds identity 1 (its checkpoints in gs://B/runs/a/), job B identity 2 (gs://B/runs/b/).

P, B = "proj-a", "ckpt-bucket"
A, NODE_B, IDLE = (deployment.service_account_email(deployment.node_identity(i), P) for i in (1, 2, 3))
POLICY = iam.Policy(P, B, (A, NODE_B, IDLE), {A: f"gs://{B}/runs/a/", NODE_B: f"gs://{B}/runs/b/"})
DATABASE = f"projects/{P}/databases/"
OBJECT = f"projects/_/buckets/{B}/objects/"
RELEASE = f"{OBJECT}{deployment.RELEASES_PREFIX}/build-7/respawn-agent-0.1.0.pyz"
WORKDIR = f"{OBJECT}{WORKDIRS_PREFIX}/sha256-{'a' * 64}.tar.gz"


def test_a_node_writes_its_own_jobs_heartbeats_and_no_job_state():
    own, other = (f"{DATABASE}{deployment.heartbeat_database(i)}" for i in (A, NODE_B))
    for perm in ("datastore.entities.create", "datastore.entities.update"):
        assert POLICY.may(A, perm, own)
        assert not POLICY.may(A, perm, other)  # another job's heartbeats: it cannot say that job's nodes are alive
        assert not POLICY.may(A, perm, f"{DATABASE}{NODES_DATABASE}")  # nor the pool-less deployment's database
        # jobs/* (a new one makes the controller create paid VMs), their events, the leases, the capacity records
        assert not POLICY.may(A, perm, f"{DATABASE}(default)")
    assert not POLICY.may(A, "datastore.entities.get", f"{DATABASE}(default)")
    assert not POLICY.may(A, "datastore.entities.delete", own)
    # The controller reads them all.
    assert POLICY.may("controller", "datastore.entities.get", other)
    assert POLICY.may("controller", "datastore.entities.update", f"{DATABASE}(default)")


def test_a_node_reads_the_release_and_workdirs_and_cannot_change_them():
    for obj in (RELEASE, WORKDIR):
        assert POLICY.may(A, "storage.objects.get", obj)
        for perm in ("storage.objects.delete", "storage.objects.create", "storage.objects.update"):
            assert not POLICY.may(A, perm, obj), (perm, obj)
    # Nor list them: a workdir archive's name is the digest of its content, so another job's cannot be guessed.
    assert not POLICY.may(A, "storage.objects.list", f"projects/_/buckets/{B}")


def test_a_node_reaches_its_own_jobs_checkpoints_and_no_other_jobs():
    own, other = f"{OBJECT}runs/a/step-00000100/rank-0.distcp", f"{OBJECT}runs/b/step-00000100/rank-0.distcp"
    for perm in ("storage.objects.create", "storage.objects.get", "storage.objects.list", "storage.objects.delete"):
        assert POLICY.may(A, perm, own), perm
        assert not POLICY.may(A, perm, other), perm
        assert POLICY.may(NODE_B, perm, other) and not POLICY.may(NODE_B, perm, own), perm
        assert not POLICY.may(IDLE, perm, own), perm  # an identity no job holds reaches no checkpoint
    assert not POLICY.may(A, "storage.objects.create", f"{OBJECT}runs/ab/x")  # a folder is a prefix ending in /
    assert not POLICY.may(A, "storage.objects.get", "projects/_/buckets/other-bucket/objects/runs/a/x")


def test_a_node_creates_no_vm_attaches_no_identity_and_publishes_no_alert():
    assert not POLICY.may(A, "compute.instances.create", f"projects/{P}/zones/us-central1-a/instances/x")
    assert not POLICY.may(A, "tpu.nodes.create", f"projects/{P}/locations/us-central2-b/nodes/x")
    for identity in (A, NODE_B):
        account = f"projects/{P}/serviceAccounts/{identity}"
        assert not POLICY.may(A, "iam.serviceAccounts.actAs", account)
        assert POLICY.may("controller", "iam.serviceAccounts.actAs", account)
    assert not POLICY.may("controller", "iam.serviceAccounts.actAs",
                          f"projects/{P}/serviceAccounts/{P}-compute@developer.gserviceaccount.com")
    assert not POLICY.may(A, "storage.managedFolders.setIamPolicy", f"projects/_/buckets/{B}")  # cannot widen its grant
    assert POLICY.may(A, "pubsub.topics.publish", f"projects/{P}/topics/{deployment.SWEEP_TOPIC}")
    assert not POLICY.may(A, "pubsub.topics.publish", f"projects/{P}/topics/{deployment.ALERTS_TOPIC}")
    assert not [p for p in iam.load()["predefined"] if p["member"] == "node"]


def test_each_condition_admits_what_its_expression_says():
    # The CEL is what IAM evaluates, `admits` what the tests above evaluate: both are made from the same names.
    for name, make in iam.CONDITIONS.items():
        c = make(P, B, A)
        quoted = re.findall(r'"([^"]+)"', c.expression)
        assert quoted, name
        for literal in quoted:
            inside = literal + ("x" if literal.endswith("/") else "")
            assert c.admits(inside) != c.expression.startswith("!"), (name, inside)
